//! `[http]`: where the metrics, health and preview endpoint listens, which `Host` names it
//! answers, and its optional authentication (a bearer token from a file, basic auth with a
//! hashed password).

use std::net::SocketAddr;

use toml::Spanned;

use super::raw::RawHttp;
use crate::spec::{Diagnostic, PasswordHash, Secret, read_password_file};

/// `[http]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// Host names (lowercase, no port) a request may name beside loopback and `listen`'s IP.
    pub allowed_hosts: Vec<String>,
    /// `token_file`'s bearer token.
    pub token: Option<Secret>,
    pub basic: Option<BasicAuth>,
}

impl HttpConfig {
    /// Only `listen`: loopback names, no authentication.
    pub fn open(listen: SocketAddr) -> Self {
        Self {
            listen,
            allowed_hosts: Vec::new(),
            token: None,
            basic: None,
        }
    }

    /// Whether a token or a password is asked for.
    pub fn authenticates(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }
}

/// `basic_user` with `basic_password_hash` (or the deprecated `basic_password_sha256`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    pub user: String,
    /// Only a hash of the password is ever held.
    pub password: PasswordCheck,
}

/// How a basic-auth password is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordCheck {
    /// `basic_password_hash`: salted and slow (Argon2).
    Argon2(PasswordHash),
    /// `basic_password_sha256`, deprecated: unsalted and fast, so a leaked file gives the
    /// password to a dictionary at billions of guesses a second. Still taken (a service must
    /// not stop at an upgrade), with a warning at every start.
    Sha256([u8; 32]),
}

/// What `basic_user` needs, for the messages.
const HOW_TO_HASH: &str = "basic_password_hash (make it with: vidflow hash-password)";

pub(super) fn resolve_http(raw: &RawHttp, diags: &mut Vec<Diagnostic>) -> Option<HttpConfig> {
    let before = diags.len();
    let listen = match raw.listen.get_ref().parse() {
        Ok(listen) => Some(listen),
        Err(_) => {
            diags.push(Diagnostic::at(
                raw.listen.span(),
                format!(
                    "http: listen must be an IP address and a port, like \"127.0.0.1:9464\", not \"{}\"",
                    raw.listen.get_ref()
                ),
            ));
            None
        }
    };
    let allowed_hosts = raw
        .allowed_hosts
        .iter()
        .flatten()
        .filter_map(|h| host_name(h, diags))
        .collect();
    let token = raw.token_file.as_ref().and_then(|f| {
        let problem = match read_password_file(f.get_ref()) {
            Ok(token) if !token.trim().is_empty() => return Some(Secret::new(token)),
            Ok(_) => format!("http: token_file \"{}\" is empty", f.get_ref().display()),
            Err(e) => format!("http: token_file: {e}"),
        };
        diags.push(Diagnostic::at(f.span(), problem));
        None
    });
    let basic = basic(raw, diags);
    if diags.len() > before {
        return None;
    }
    Some(HttpConfig {
        listen: listen?,
        allowed_hosts,
        token,
        basic,
    })
}

/// An `allowed_hosts` entry: a name or an IP address, without a port.
fn host_name(host: &Spanned<String>, diags: &mut Vec<Diagnostic>) -> Option<String> {
    let name = host.get_ref();
    let bracketed_v6 = name.starts_with('[') && name.ends_with(']');
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !name.is_empty() && (plain || bracketed_v6) {
        return Some(name.trim_end_matches('.').to_ascii_lowercase());
    }
    diags.push(Diagnostic::at(
        host.span(),
        format!(
            "http: allowed_hosts: \"{name}\" is not a host name (letters, digits, '-' and '.', \
             or an IPv6 address in brackets; no port, no scheme)"
        ),
    ));
    None
}

/// `basic_user` with `basic_password_hash` or (deprecated) `basic_password_sha256`: a user
/// and one hash, or neither.
fn basic(raw: &RawHttp, diags: &mut Vec<Diagnostic>) -> Option<BasicAuth> {
    let (argon2, sha256) = (&raw.basic_password_hash, &raw.basic_password_sha256);
    if let (Some(_), Some(old)) = (argon2, sha256) {
        diags.push(Diagnostic::at(
            old.span(),
            "http: basic_password_sha256 and basic_password_hash both given; keep \
             basic_password_hash only",
        ));
        return None;
    }
    let hash_span = argon2.as_ref().or(sha256.as_ref()).map(Spanned::span);
    let user = match (&raw.basic_user, hash_span) {
        (None, None) => return None,
        (Some(user), None) => {
            diags.push(Diagnostic::at(
                user.span(),
                format!("http: basic_user needs {HOW_TO_HASH}"),
            ));
            return None;
        }
        (None, Some(span)) => {
            diags.push(Diagnostic::at(
                span,
                "http: a password hash needs basic_user",
            ));
            return None;
        }
        (Some(user), Some(_)) => user,
    };
    let user_ok = !user.get_ref().is_empty() && !user.get_ref().contains(':');
    if !user_ok {
        diags.push(Diagnostic::at(
            user.span(),
            "http: basic_user must be a non-empty name without ':'",
        ));
    }
    let password = match (argon2, sha256) {
        (Some(phc), _) => PasswordHash::parse(phc.get_ref())
            .map(PasswordCheck::Argon2)
            .map_err(|e| {
                diags.push(Diagnostic::at(
                    phc.span(),
                    format!("http: basic_password_hash: {e}"),
                ));
            })
            .ok(),
        (None, Some(hex)) => {
            let digest = sha256_hex(hex.get_ref());
            if digest.is_none() {
                // The hash is not the password, but there is no need to print it either.
                diags.push(Diagnostic::at(
                    hex.span(),
                    format!(
                        "http: basic_password_sha256 must be 64 hex digits, not {} characters; \
                         better, replace it with {HOW_TO_HASH}",
                        hex.get_ref().chars().count()
                    ),
                ));
            }
            digest.map(PasswordCheck::Sha256)
        }
        (None, None) => None,
    };
    Some(BasicAuth {
        user: user.get_ref().clone(),
        password: password.filter(|_| user_ok)?,
    })
}

/// 64 hex digits -> 32 bytes.
fn sha256_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sha256_in_hex_becomes_its_bytes_and_anything_else_is_refused() {
        let hex = "ff".repeat(31) + "0a";
        let bytes = sha256_hex(&hex).unwrap();
        assert_eq!((bytes[0], bytes[31]), (0xff, 0x0a));
        assert_eq!(sha256_hex("abc"), None);
        assert_eq!(sha256_hex(&"zz".repeat(32)), None);
    }
}
