//! The `mqtt` sink's parameters: the broker URL (with its credentials kept as a [`Secret`]),
//! the topic, QoS, backlog, and the TLS set-up of `mqtts://`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::QoS;
use serde::Deserialize;
use toml::Spanned;

use super::super::common::net::{self, Mode, ServerUrl};
use super::super::{SinkError, SinkFactory};

use crate::spec::{Diagnostic, Params, Secret, read_password_file};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: Spanned<String>,
    topic: Option<Spanned<String>>,
    #[serde(default)]
    mode: Mode,
    qos: Option<Spanned<u8>>,
    #[serde(default)]
    retain: bool,
    client_id: Option<String>,
    username: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    backlog: Option<Spanned<usize>>,
    flush_timeout_ms: Option<u64>,
    every_n_frames: Option<Spanned<u64>>,
    #[serde(default)]
    discovery: bool,
    discovery_prefix: Option<Spanned<String>>,
}

/// Where and how to connect (the password apart, as a [`Secret`]).
#[derive(Debug, Clone)]
pub(super) struct Broker {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) tls: bool,
    pub(super) login: Option<(String, Secret)>,
    /// The URL as it may be shown: without its password.
    pub(super) shown: String,
}

#[derive(Debug)]
pub(super) struct Factory {
    pub(super) broker: Broker,
    pub(super) topic: String,
    pub(super) mode: Mode,
    pub(super) qos: QoS,
    pub(super) retain: bool,
    pub(super) client_id: Option<String>,
    pub(super) backlog: usize,
    pub(super) flush_timeout: Duration,
    pub(super) every: u64,
    /// Home Assistant discovery: its topic prefix.
    pub(super) discovery: Option<String>,
}

pub(super) fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let mut broker = parse_url(c.url.get_ref()).map_err(|m| Diagnostic::at(c.url.span(), m))?;
    match (c.username, c.password_file) {
        (Some(u), _) if broker.login.is_some() => {
            return Err(Diagnostic::at(
                u.span(),
                "the url already has credentials; give them in one place",
            ));
        }
        (Some(u), Some(f)) => {
            let password =
                read_password_file(f.get_ref()).map_err(|m| Diagnostic::at(f.span(), m))?;
            broker.login = Some((u.into_inner(), Secret::new(password)));
        }
        (Some(u), None) => broker.login = Some((u.into_inner(), Secret::new(String::new()))),
        (None, Some(f)) => {
            return Err(Diagnostic::at(f.span(), "a password needs \"username\""));
        }
        (None, None) => {}
    }
    let topic = match c.topic {
        Some(t) => {
            check_topic(t.get_ref()).map_err(|m| Diagnostic::at(t.span(), m))?;
            t.into_inner()
        }
        None => "vidflow/{source}/{sink}".to_owned(),
    };
    let qos = match c.qos {
        None => QoS::AtLeastOnce,
        Some(q) => match q.get_ref() {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            n => {
                return Err(Diagnostic::at(
                    q.span(),
                    format!("qos must be 0 or 1, not {n}"),
                ));
            }
        },
    };
    let backlog = net::backlog(c.backlog)?;
    let every = net::every_n_frames(c.every_n_frames)?;
    let discovery = match (c.discovery, c.discovery_prefix) {
        (false, Some(p)) => {
            return Err(Diagnostic::at(
                p.span(),
                "discovery_prefix needs discovery = true",
            ));
        }
        (true, Some(p)) => {
            check_topic(p.get_ref()).map_err(|m| Diagnostic::at(p.span(), m))?;
            Some(p.into_inner())
        }
        (true, None) => Some("homeassistant".to_owned()),
        (false, None) => None,
    };
    Ok(Box::new(Factory {
        broker,
        topic,
        mode: c.mode,
        qos,
        retain: c.retain,
        client_id: c.client_id,
        backlog,
        flush_timeout: c
            .flush_timeout_ms
            .map_or(net::DEFAULT_FLUSH_TIMEOUT, Duration::from_millis),
        every,
        discovery,
    }))
}

/// `mqtt://[user[:password]@]host[:port][/]`, `mqtts://...`, parsed as a [`ServerUrl`]: the
/// host, port and login given to rumqttc come from the same parse as what is shown.
fn parse_url(url: &str) -> Result<Broker, String> {
    let u = ServerUrl::parse(
        url,
        &["mqtt", "mqtts"],
        &["tcp", "ssl"],
        "mqtt://host[:port] or mqtts://host[:port]",
    )?;
    let (tls, default_port) = match u.scheme.as_str() {
        "mqtts" | "ssl" => (true, 8883),
        _ => (false, 1883),
    };
    if !u.path().is_empty() {
        return Err(u.bad("a broker url has no path or query (the topic is `topic`)"));
    }
    let address = &u.address;
    let login = address.has_credentials().then(|| {
        let password = address.password().cloned();
        (
            address.user().to_owned(),
            password.unwrap_or_else(|| Secret::new(String::new())),
        )
    });
    Ok(Broker {
        host: u.host.clone(),
        port: u.port.unwrap_or(default_port),
        tls,
        login,
        shown: address.to_string(),
    })
}

/// A topic to publish to: no wildcards, only the `{source}` and `{sink}` placeholders.
fn check_topic(topic: &str) -> Result<(), String> {
    let bare = topic.replace("{source}", "").replace("{sink}", "");
    if topic.is_empty() {
        Err("topic must not be empty".to_owned())
    } else if bare.contains(['+', '#']) {
        Err(format!(
            "topic \"{topic}\": wildcards + and # are for subscribing, not publishing"
        ))
    } else if bare.contains(['{', '}']) {
        Err(format!(
            "topic \"{topic}\": the only placeholders are {{source}} and {{sink}}"
        ))
    } else {
        Ok(())
    }
}

pub(super) fn tls_config() -> Result<rumqttc::TlsConfiguration, SinkError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(SinkError::Other(
            "mqtts: no trusted root certificates on this system (install ca-certificates)".into(),
        ));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SinkError::Other(format!("mqtts: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(rumqttc::TlsConfiguration::from(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_tls_and_login() {
        let b = parse_url("mqtt://broker.lan").unwrap();
        assert_eq!(
            (b.host.as_str(), b.port, b.tls),
            ("broker.lan", 1883, false)
        );
        let b = parse_url("mqtts://u:p%40ss@10.0.0.2:9999/").unwrap();
        assert_eq!((b.host.as_str(), b.port, b.tls), ("10.0.0.2", 9999, true));
        let (user, password) = b.login.unwrap();
        assert_eq!((user.as_str(), password.expose()), ("u", "p@ss"));
        assert_eq!(b.shown, "mqtts://u:***@10.0.0.2:9999/");
        let b = parse_url("mqtt://[::1]:1884").unwrap();
        assert_eq!((b.host.as_str(), b.port), ("::1", 1884));
        let e = parse_url("mqtt://u:p@s#s@h").unwrap_err();
        assert!(e.contains("url \"mqtt://***@h\""), "{e}");
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for (url, want) in [
            ("http://h", "unknown scheme \"http\""),
            ("mqtt://u:hunter2@h:0", "bad port \"0\""),
            ("mqtt://u:hunter2@h/x", "no path"),
            ("mqtt://u:hunter2@h?x", "no query"),
            ("broker:1883", "expected mqtt://"),
            ("mqtt://", "no host"),
        ] {
            let e = parse_url(url).unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn topics_take_only_known_placeholders() {
        assert!(check_topic("vidflow/{source}/{sink}").is_ok());
        assert!(check_topic("a/+/b").unwrap_err().contains("wildcards"));
        assert!(
            check_topic("a/{camera}")
                .unwrap_err()
                .contains("placeholders")
        );
        assert!(check_topic("").is_err());
    }
}
