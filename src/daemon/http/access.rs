//! Who may ask: the `Host` check (against DNS rebinding: a web page in a browser on this
//! machine may reach a loopback port, but its requests name the page's own host) and the
//! optional authentication (`[http] token_file`, `basic_user` + `basic_password_sha256`).
//!
//! Credentials are compared as SHA-256 digests with `subtle`'s constant-time equality: the
//! time taken says nothing about how much of a guess was right, nor about the secret's length.

use std::net::{IpAddr, SocketAddr};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::HttpConfig;

/// Host names always answered: the loopback names a local client uses.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The checks of one endpoint, made from its `[http]` once.
#[derive(Debug)]
pub(super) struct Access {
    /// Lowercase names without port.
    hosts: Vec<String>,
    token_sha256: Option<[u8; 32]>,
    /// User and the SHA-256 of the password.
    basic: Option<(String, [u8; 32])>,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No `Host` header (HTTP/1.1 requires one).
    NoHost,
    /// A `Host` this endpoint does not answer to.
    Host(String),
    /// No or wrong credentials.
    Unauthorized,
}

impl Access {
    pub(super) fn new(config: &HttpConfig, bound: SocketAddr) -> Self {
        let mut hosts: Vec<String> = LOOPBACK_NAMES.iter().map(|&h| h.to_owned()).collect();
        for ip in [config.listen.ip(), bound.ip()] {
            if !ip.is_unspecified() {
                hosts.push(host_of_ip(ip));
            }
        }
        hosts.extend(config.allowed_hosts.iter().cloned());
        Self {
            hosts,
            token_sha256: config.token.as_ref().map(|t| sha256(t.expose())),
            basic: config
                .basic
                .as_ref()
                .map(|b| (b.user.clone(), b.password_sha256)),
        }
    }

    /// The `Host` header names this endpoint (its port is not compared: a rebinding page
    /// names its own host, whatever the port).
    pub(super) fn check_host(&self, host: Option<&str>) -> Result<(), Refusal> {
        let host = host.ok_or(Refusal::NoHost)?;
        let name = without_port(host)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if self.hosts.contains(&name) {
            Ok(())
        } else {
            Err(Refusal::Host(host.to_owned()))
        }
    }

    /// Whether any credentials are asked for.
    pub(super) fn authenticates(&self) -> bool {
        self.token_sha256.is_some() || self.basic.is_some()
    }

    /// The `Authorization` header carries the token or the user and password, when asked for.
    pub(super) fn check_credentials(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        if !self.authenticates() {
            return Ok(());
        }
        let (scheme, value) = authorization
            .and_then(|a| a.trim().split_once(' '))
            .ok_or(Refusal::Unauthorized)?;
        let value = value.trim();
        let granted = if scheme.eq_ignore_ascii_case("bearer") {
            self.token_sha256
                .is_some_and(|want| bool::from(sha256(value).ct_eq(&want)))
        } else if scheme.eq_ignore_ascii_case("basic") {
            self.basic.as_ref().is_some_and(|(user, want)| {
                let Some((given_user, password)) = basic_credentials(value) else {
                    return false;
                };
                // Both compared, always, so the time does not say which was wrong.
                let user_ok = sha256(&given_user).ct_eq(&sha256(user));
                let password_ok = sha256(&password).ct_eq(want);
                bool::from(user_ok & password_ok)
            })
        } else {
            false
        };
        if granted {
            Ok(())
        } else {
            Err(Refusal::Unauthorized)
        }
    }

    /// The `WWW-Authenticate` challenges of a 401.
    pub(super) fn challenge(&self) -> String {
        let mut out = String::new();
        if self.token_sha256.is_some() {
            out.push_str("WWW-Authenticate: Bearer realm=\"vidflow\"\r\n");
        }
        if self.basic.is_some() {
            out.push_str("WWW-Authenticate: Basic realm=\"vidflow\", charset=\"UTF-8\"\r\n");
        }
        out
    }
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// `user:password` from base64.
fn basic_credentials(encoded: &str) -> Option<(String, String)> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// How an IP appears in a `Host` header: IPv6 in brackets.
fn host_of_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// `name:port` -> `name`; `[v6]:port` -> `[v6]`.
fn without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BasicAuth;
    use crate::spec::Secret;

    fn access(token: Option<&str>, basic: Option<(&str, &str)>) -> Access {
        let mut config = HttpConfig::open("127.0.0.1:9464".parse().unwrap());
        config.allowed_hosts = vec!["cams.example".to_owned()];
        config.token = token.map(|t| Secret::new(t.to_owned()));
        config.basic = basic.map(|(user, password)| BasicAuth {
            user: user.to_owned(),
            password_sha256: sha256(password),
        });
        Access::new(&config, config.listen)
    }

    #[test]
    fn loopback_names_the_listen_address_and_allowed_hosts_pass_with_or_without_port() {
        let a = access(None, None);
        for host in [
            "localhost:9464",
            "LOCALHOST",
            "127.0.0.1:9464",
            "[::1]:9464",
            "cams.example",
            "cams.example.:80",
        ] {
            assert_eq!(a.check_host(Some(host)), Ok(()), "{host}");
        }
    }

    #[test]
    fn a_rebinding_page_s_host_and_a_missing_host_are_refused() {
        let a = access(None, None);
        assert_eq!(
            a.check_host(Some("evil.example:9464")),
            Err(Refusal::Host("evil.example:9464".to_owned()))
        );
        assert_eq!(
            a.check_host(Some("localhost.evil.example")),
            Err(Refusal::Host("localhost.evil.example".to_owned()))
        );
        assert_eq!(a.check_host(None), Err(Refusal::NoHost));
    }

    #[test]
    fn without_configured_credentials_everything_is_granted() {
        assert_eq!(access(None, None).check_credentials(None), Ok(()));
    }

    #[test]
    fn the_bearer_token_is_granted_and_a_wrong_or_missing_one_is_refused() {
        let a = access(Some("s3cret"), None);
        assert_eq!(a.check_credentials(Some("Bearer s3cret")), Ok(()));
        assert_eq!(a.check_credentials(Some("bearer  s3cret ")), Ok(()));
        for wrong in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("s3cret"),
        ] {
            assert_eq!(a.check_credentials(wrong), Err(Refusal::Unauthorized));
        }
    }

    #[test]
    fn basic_credentials_match_user_and_password_hash() {
        let a = access(None, Some(("ops", "pa:ss")));
        let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let header = |s: &str| format!("Basic {}", encode(s));
        assert_eq!(a.check_credentials(Some(&header("ops:pa:ss"))), Ok(()));
        for wrong in ["ops:pass", "op:pa:ss", "ops", ""] {
            assert_eq!(
                a.check_credentials(Some(&header(wrong))),
                Err(Refusal::Unauthorized),
                "{wrong}"
            );
        }
        assert_eq!(
            a.check_credentials(Some("Bearer pa:ss")),
            Err(Refusal::Unauthorized)
        );
    }
}
