//! Who may ask: the `Host` check (against DNS rebinding: a web page in a browser on this
//! machine may reach a loopback port, but its requests name the page's own host) and the
//! optional authentication (`[http] token_file`, `basic_user` + `basic_password_hash`, or the
//! deprecated `basic_password_sha256`).
//!
//! A token, a user and a SHA-256 password are compared as SHA-256 digests with `subtle`'s
//! constant-time equality: the time taken says nothing about how much of a guess was right, nor
//! about the secret's length. An Argon2 password ([`PasswordHash`]) takes tens of milliseconds
//! to check, on purpose: the loop never checks one itself. It answers [`Verdict::Verify`], and
//! the request goes to the verifier thread (`verify.rs`), which calls [`Access::verify`]. The
//! credentials that pass are remembered as a keyed digest (a random key made at start, never
//! stored): a request with the same user and password is then granted by the loop at the cost
//! of one SHA-256, so a browser's every request (the page, each preview, each refresh) is not a
//! slow check. Only one password can pass, so one digest is all there is to remember; wrong
//! ones are not remembered (a client trying passwords costs the verifier, never the loop).

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use base64::Engine as _;
use password_hash::rand_core::{OsRng, RngCore};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{HttpConfig, PasswordCheck};
use crate::spec::{PasswordHash, Secret};

/// The cookie that keeps the token in a browser: set when the page is opened as `/?token=TOKEN`
/// (a browser sends no `Authorization: Bearer` by itself), then sent with each of the page's
/// requests (its scripts, the API, the live stream, the previews).
pub(super) const TOKEN_COOKIE: &str = "vidflow_token";

/// Host names always answered: the loopback names a local client uses.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The checks of one endpoint, made from its `[http]` once.
#[derive(Debug)]
pub(super) struct Access {
    /// Lowercase names without port.
    hosts: Vec<String>,
    token_sha256: Option<[u8; 32]>,
    basic: Option<Basic>,
}

/// Basic auth's user and password check.
#[derive(Debug)]
struct Basic {
    user_sha256: [u8; 32],
    password: PasswordCheck,
    /// The random key of [`Basic::verified`]'s digest, made at start.
    key: [u8; 32],
    /// The keyed digest of the user and password that passed the Argon2 check: set once by
    /// the verifier thread, read by the loop (a `OnceLock`: no lock either waits on).
    verified: OnceLock<[u8; 32]>,
}

impl Basic {
    /// `user` and `password` digested with this run's key.
    fn keyed(&self, user: &str, password: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(user.as_bytes());
        h.update([0]);
        h.update(password.as_bytes());
        h.finalize().into()
    }
}

/// What a request's credentials get on the loop.
#[derive(Debug)]
pub(super) enum Verdict {
    Granted,
    Refused,
    /// Basic credentials only an Argon2 check can judge: for the verifier thread.
    Verify(Credentials),
}

/// A user and password waiting for the slow check.
#[derive(Debug)]
pub(super) struct Credentials {
    user: String,
    password: Secret,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No `Host` header (HTTP/1.1 requires one).
    NoHost,
    /// A `Host` this endpoint does not answer to.
    Host(String),
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
            basic: config.basic.as_ref().map(|b| {
                let mut key = [0u8; 32];
                OsRng.fill_bytes(&mut key);
                Basic {
                    user_sha256: sha256(&b.user),
                    password: b.password.clone(),
                    key,
                    verified: OnceLock::new(),
                }
            }),
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

    /// Whether basic auth has an Argon2 password (a verifier thread is needed).
    pub(super) fn verifies_slowly(&self) -> bool {
        self.basic
            .as_ref()
            .is_some_and(|b| matches!(b.password, PasswordCheck::Argon2(_)))
    }

    /// The `Authorization` header carries the token or the user and password, when asked for:
    /// judged at once, except basic credentials for an Argon2 password that have not passed
    /// before ([`Verdict::Verify`]).
    pub(super) fn check_credentials(&self, authorization: Option<&str>) -> Verdict {
        if !self.authenticates() {
            return Verdict::Granted;
        }
        let Some((scheme, value)) = authorization.and_then(|a| a.trim().split_once(' ')) else {
            return Verdict::Refused;
        };
        let value = value.trim();
        let granted = if scheme.eq_ignore_ascii_case("bearer") {
            self.check_token(value)
        } else if scheme.eq_ignore_ascii_case("basic") {
            let (Some(basic), Some((user, password))) = (&self.basic, basic_credentials(value))
            else {
                return Verdict::Refused;
            };
            // The user is compared, always, so the time does not say which was wrong.
            let user_ok = sha256(&user).ct_eq(&basic.user_sha256);
            match &basic.password {
                PasswordCheck::Sha256(want) => bool::from(user_ok & sha256(&password).ct_eq(want)),
                PasswordCheck::Argon2(_) => {
                    let given = basic.keyed(&user, &password);
                    let known = basic
                        .verified
                        .get()
                        .is_some_and(|v| bool::from(given.ct_eq(v)));
                    if !known {
                        return Verdict::Verify(Credentials {
                            user,
                            password: Secret::new(password),
                        });
                    }
                    true
                }
            }
        } else {
            false
        };
        if granted {
            Verdict::Granted
        } else {
            Verdict::Refused
        }
    }

    /// Whether `token` is the endpoint's token (given in the page's `?token=` or its cookie).
    pub(super) fn check_token(&self, token: &str) -> bool {
        self.token_sha256
            .is_some_and(|want| bool::from(sha256(token).ct_eq(&want)))
    }

    /// The slow check of basic credentials against the Argon2 password (for the verifier
    /// thread): both user and password are checked, always; credentials that pass are
    /// remembered for the loop.
    pub(super) fn verify(&self, credentials: &Credentials) -> bool {
        let Some(basic) = &self.basic else {
            return false;
        };
        let PasswordCheck::Argon2(hash) = &basic.password else {
            return false;
        };
        let user_ok = bool::from(sha256(&credentials.user).ct_eq(&basic.user_sha256));
        let password_ok = PasswordHash::verify(hash, credentials.password.expose());
        let granted = user_ok && password_ok;
        if granted {
            let _ = basic
                .verified
                .set(basic.keyed(&credentials.user, credentials.password.expose()));
        }
        granted
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

    fn access(token: Option<&str>, basic: Option<(&str, PasswordCheck)>) -> Access {
        let mut config = HttpConfig::open("127.0.0.1:9464".parse().unwrap());
        config.allowed_hosts = vec!["cams.example".to_owned()];
        config.token = token.map(|t| Secret::new(t.to_owned()));
        config.basic = basic.map(|(user, password)| BasicAuth {
            user: user.to_owned(),
            password,
        });
        Access::new(&config, config.listen)
    }

    fn header(user_password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
    }

    fn granted(a: &Access, authorization: Option<&str>) -> bool {
        matches!(a.check_credentials(authorization), Verdict::Granted)
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
        assert!(granted(&access(None, None), None));
    }

    #[test]
    fn the_bearer_token_is_granted_and_a_wrong_or_missing_one_is_refused() {
        let a = access(Some("s3cret"), None);
        assert!(granted(&a, Some("Bearer s3cret")));
        assert!(granted(&a, Some("bearer  s3cret ")));
        for wrong in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("s3cret"),
        ] {
            assert!(
                matches!(a.check_credentials(wrong), Verdict::Refused),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn a_deprecated_sha256_password_is_judged_on_the_loop() {
        let a = access(None, Some(("ops", PasswordCheck::Sha256(sha256("pa:ss")))));
        assert!(!a.verifies_slowly());
        assert!(granted(&a, Some(&header("ops:pa:ss"))));
        for wrong in ["ops:pass", "op:pa:ss", "ops", ""] {
            assert!(
                matches!(a.check_credentials(Some(&header(wrong))), Verdict::Refused),
                "{wrong}"
            );
        }
        assert!(matches!(
            a.check_credentials(Some("Bearer pa:ss")),
            Verdict::Refused
        ));
    }

    #[test]
    fn an_argon2_password_is_checked_off_the_loop_once_then_granted_on_it() {
        let hash = PasswordHash::make("pa:ss").unwrap();
        let a = access(None, Some(("ops", PasswordCheck::Argon2(hash))));
        assert!(a.verifies_slowly());
        let ask = |user_password: &str| a.check_credentials(Some(&header(user_password)));
        // Not yet checked: every basic header goes to the verifier, right or wrong.
        for given in ["ops:pa:ss", "ops:pass", "op:pa:ss"] {
            let Verdict::Verify(credentials) = ask(given) else {
                panic!("{given}: judged on the loop");
            };
            assert_eq!(a.verify(&credentials), given == "ops:pa:ss", "{given}");
        }
        // Passed once: the same credentials are granted on the loop; others still go.
        assert!(matches!(ask("ops:pa:ss"), Verdict::Granted));
        for wrong in ["ops:pass", "op:pa:ss", "ops:pa:s", "ops:pa:ss "] {
            let Verdict::Verify(credentials) = ask(wrong) else {
                panic!("{wrong}: judged on the loop");
            };
            assert!(!a.verify(&credentials), "{wrong}");
        }
        assert!(matches!(ask("ops"), Verdict::Refused));
        assert!(matches!(
            a.check_credentials(Some("Bearer pa:ss")),
            Verdict::Refused
        ));
    }
}
