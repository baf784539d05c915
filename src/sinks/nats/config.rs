//! The `nats` sink's parameters: the servers (their credentials kept as [`Secret`]s, read from
//! files), the subject, the stream it may create, and TLS.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::super::common::net::ServerUrl;
use super::super::common::stream::Delivery;
use crate::spec::{Diagnostic, Params, Secret, read_password_file};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: Spanned<String>,
    subject: Option<Spanned<String>>,
    stream: Option<Spanned<String>>,
    replicas: Option<Spanned<usize>>,
    username: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    token_file: Option<Spanned<PathBuf>>,
    creds_file: Option<Spanned<PathBuf>>,
    tls_ca_file: Option<Spanned<PathBuf>>,
    tls_cert_file: Option<Spanned<PathBuf>>,
    tls_key_file: Option<Spanned<PathBuf>>,
    ack_timeout_ms: Option<Spanned<u64>>,
    batch: Option<Spanned<usize>>,
}

/// How the client proves who it is; every secret as a [`Secret`].
#[derive(Debug, Clone)]
pub(super) enum Auth {
    None,
    Password(String, Secret),
    Token(Secret),
    /// A `.creds` file's text (JWT and nkey seed).
    Creds(Secret),
}

impl Auth {
    /// `text` with every secret of this login replaced by `***`.
    pub(super) fn scrub(&self, text: &str) -> String {
        match self {
            Self::None => text.to_owned(),
            Self::Password(_, s) | Self::Token(s) => s.scrub(text),
            Self::Creds(s) => s
                .expose()
                .lines()
                .map(str::trim)
                .filter(|l| l.len() >= 16 && !l.starts_with("---"))
                .fold(text.to_owned(), |t, l| Secret::new(l.to_owned()).scrub(&t)),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Tls {
    pub(super) required: bool,
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug)]
pub(super) struct Factory {
    /// `nats://host:port` or `tls://host:port`, without credentials.
    pub(super) servers: Vec<String>,
    /// The servers as they may be shown.
    pub(super) shown: String,
    pub(super) auth: Auth,
    pub(super) tls: Tls,
    pub(super) subject: String,
    pub(super) stream: Option<(String, usize)>,
    pub(super) ack_timeout: Duration,
    pub(super) batch: usize,
    pub(super) delivery: Delivery,
}

/// `ack_timeout_ms` when the file does not say.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn build(params: Params<'_>) -> Result<Box<dyn super::super::SinkFactory>, Diagnostic> {
    let (delivery, own) = Delivery::split(params)?;
    let c: Config = own.parse()?;
    let at = |s: std::ops::Range<usize>| move |m: String| Diagnostic::at(s.clone(), m);
    let (servers, shown, auth) = parse_urls(c.url.get_ref()).map_err(at(c.url.span()))?;
    let auth = login(&c, auth)?;
    let tls = tls(&c, &servers)?;
    let subject = match c.subject {
        Some(s) => {
            check_subject(s.get_ref()).map_err(at(s.span()))?;
            s.into_inner()
        }
        None => "vidflow.{source}.{sink}".to_owned(),
    };
    let replicas = match &c.replicas {
        Some(r) if !(1..=5).contains(r.get_ref()) => {
            return Err(Diagnostic::at(r.span(), "replicas must be between 1 and 5"));
        }
        Some(r) if c.stream.is_none() => {
            return Err(Diagnostic::at(
                r.span(),
                "replicas is for the stream the sink creates: give \"stream\" too",
            ));
        }
        Some(r) => *r.get_ref(),
        None => 1,
    };
    let stream = match c.stream {
        Some(s) if !valid_stream_name(s.get_ref()) => {
            return Err(Diagnostic::at(
                s.span(),
                format!(
                    "stream \"{}\": a stream name has no spaces, '.', '*', '>', '/' or '\\\\'",
                    s.get_ref()
                ),
            ));
        }
        Some(s) => Some((s.into_inner(), replicas)),
        None => None,
    };
    let positive = |v: &Option<Spanned<u64>>, name: &str| match v {
        Some(v) if *v.get_ref() == 0 => Err(Diagnostic::at(
            v.span(),
            format!("{name} must be at least 1"),
        )),
        _ => Ok(()),
    };
    positive(&c.ack_timeout_ms, "ack_timeout_ms")?;
    let batch = super::super::common::stream::batch(c.batch)?;
    Ok(Box::new(Factory {
        servers,
        shown,
        auth,
        tls,
        subject,
        stream,
        ack_timeout: c.ack_timeout_ms.map_or(DEFAULT_ACK_TIMEOUT, |t| {
            Duration::from_millis(t.into_inner())
        }),
        batch,
        delivery,
    }))
}

/// The one login the sink may be given: `auth` from the URL, or username + password_file,
/// token_file or creds_file (files read now, so a missing one is a validate error).
fn login(c: &Config, mut auth: Auth) -> Result<Auth, Diagnostic> {
    let at = |s: std::ops::Range<usize>| move |m: String| Diagnostic::at(s.clone(), m);
    let read = |f: &Spanned<PathBuf>| read_password_file(f.get_ref()).map_err(at(f.span()));
    let given_elsewhere = !matches!(auth, Auth::None);
    let one_login = |span| {
        Diagnostic::at(
            span,
            "give one login: url credentials, username + password_file, token_file or creds_file",
        )
    };
    let mut logins = 0;
    if let Some(u) = &c.username {
        logins += 1;
        let Some(f) = &c.password_file else {
            return Err(Diagnostic::at(u.span(), "username needs password_file"));
        };
        auth = Auth::Password(u.get_ref().clone(), Secret::new(read(f)?));
    } else if let Some(f) = &c.password_file {
        return Err(Diagnostic::at(f.span(), "a password needs \"username\""));
    }
    if let Some(f) = &c.token_file {
        logins += 1;
        auth = Auth::Token(Secret::new(read(f)?));
    }
    if let Some(f) = &c.creds_file {
        logins += 1;
        let text = read(f)?;
        if !text.contains("BEGIN NATS USER JWT") {
            return Err(Diagnostic::at(
                f.span(),
                "creds_file is not a NATS credentials file (no user JWT)",
            ));
        }
        auth = Auth::Creds(Secret::new(text));
    }
    if logins + usize::from(given_elsewhere) > 1 {
        return Err(one_login(c.url.span()));
    }
    Ok(auth)
}

/// TLS: required by a `tls://` server, a CA or a client certificate; the files must exist.
fn tls(c: &Config, servers: &[String]) -> Result<Tls, Diagnostic> {
    let exists = |f: &Spanned<PathBuf>| {
        if f.get_ref().is_file() {
            Ok(f.get_ref().clone())
        } else {
            Err(Diagnostic::at(
                f.span(),
                format!("no such file \"{}\"", f.get_ref().display()),
            ))
        }
    };
    let cert = match (&c.tls_cert_file, &c.tls_key_file) {
        (Some(cert), Some(key)) => Some((exists(cert)?, exists(key)?)),
        (Some(f), None) | (None, Some(f)) => {
            return Err(Diagnostic::at(
                f.span(),
                "a client certificate needs both tls_cert_file and tls_key_file",
            ));
        }
        (None, None) => None,
    };
    let ca = c.tls_ca_file.as_ref().map(exists).transpose()?;
    Ok(Tls {
        required: servers.iter().any(|s| s.starts_with("tls://")) || ca.is_some() || cert.is_some(),
        ca,
        cert,
    })
}

/// `nats://[user:password@]host[:4222]` or `tls://...`, several separated by commas (one
/// cluster). Each is parsed as a [`ServerUrl`]: the client gets the same host and port as what
/// is shown. A user with a password is a login; a user alone is a token (NATS's convention).
fn parse_urls(text: &str) -> Result<(Vec<String>, String, Auth), String> {
    let mut servers = Vec::new();
    let mut shown = Vec::new();
    let mut auth = Auth::None;
    for url in text.split(',').map(str::trim) {
        let u = ServerUrl::parse(
            url,
            &["nats", "tls"],
            &[],
            "nats://host[:port] or tls://host[:port]",
        )?;
        if !u.path().is_empty() {
            return Err(u.bad("a server url has no path or query (the subject is `subject`)"));
        }
        let (scheme, address) = (&u.scheme, &u.address);
        let host = if u.host.contains(':') {
            format!("[{}]", u.host)
        } else {
            u.host.clone()
        };
        let port = u.port.unwrap_or(4222);
        servers.push(format!("{scheme}://{host}:{port}"));
        // A user without a password is a token: shown as `***` too.
        let token = address.has_credentials() && address.password().is_none();
        shown.push(if token {
            format!("{scheme}://***@{host}:{port}")
        } else {
            address.to_string()
        });
        if address.has_credentials() {
            let login = match address.password() {
                Some(p) => Auth::Password(address.user().to_owned(), p.clone()),
                None => Auth::Token(Secret::new(address.user().to_owned())),
            };
            if !matches!(auth, Auth::None) {
                return Err(u.bad("give the credentials once, not in each url"));
            }
            auth = login;
        }
    }
    Ok((servers, shown.join(","), auth))
}

/// A subject to publish to: tokens split by '.', no wildcards, only `{source}` and `{sink}`.
fn check_subject(subject: &str) -> Result<(), String> {
    let bare = subject.replace("{source}", "x").replace("{sink}", "x");
    if bare.is_empty() || bare.split('.').any(str::is_empty) {
        Err(format!(
            "subject \"{subject}\": empty, or an empty token between dots"
        ))
    } else if bare.contains(['*', '>']) {
        Err(format!(
            "subject \"{subject}\": wildcards * and > are for subscribing, not publishing"
        ))
    } else if bare.contains(['{', '}']) {
        Err(format!(
            "subject \"{subject}\": the only placeholders are {{source}} and {{sink}}"
        ))
    } else if bare.contains(char::is_whitespace) {
        Err(format!("subject \"{subject}\": no spaces"))
    } else {
        Ok(())
    }
}

fn valid_stream_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_servers_and_a_login_never_shown() {
        let (servers, shown, auth) =
            parse_urls("nats://vid:hunter2@10.0.0.1, tls://b.lan:4333").unwrap();
        assert_eq!(servers, ["nats://10.0.0.1:4222", "tls://b.lan:4333"]);
        assert_eq!(shown, "nats://vid:***@10.0.0.1,tls://b.lan:4333");
        assert!(matches!(&auth, Auth::Password(u, p) if u == "vid" && p.expose() == "hunter2"));
        let (_, shown, auth) = parse_urls("nats://s3cr3t-token@h").unwrap();
        assert!(matches!(&auth, Auth::Token(t) if t.expose() == "s3cr3t-token"));
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(!format!("{auth:?}").contains("s3cr3t"));
    }

    #[test]
    fn bad_urls_and_subjects_are_refused() {
        for (url, want) in [
            ("http://h", "unknown scheme"),
            ("h:4222", "expected nats://"),
            ("nats://u:hunter2@h/x", "no path"),
        ] {
            let e = parse_urls(url).unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        assert!(check_subject("vidflow.{source}.{sink}").is_ok());
        assert!(check_subject("a.*.b").unwrap_err().contains("wildcards"));
        assert!(check_subject("a..b").is_err());
        assert!(
            check_subject("a.{camera}")
                .unwrap_err()
                .contains("placeholders")
        );
    }

    #[test]
    fn a_creds_file_is_scrubbed_line_by_line() {
        let auth = Auth::Creds(Secret::new(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ\n------END NATS USER JWT------\n".into(),
        ));
        let out = auth.scrub("bad jwt eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ here");
        assert_eq!(out, "bad jwt *** here");
    }
}
