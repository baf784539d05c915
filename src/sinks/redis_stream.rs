//! `redis_stream`: appends each frame's JSON to a Redis stream (XADD, the `redis` crate's
//! synchronous client), trimmed to about `maxlen` entries (`MAXLEN ~`).
//!
//! Threads: the sink's thread and `vidflow-redis_stream-NAME`, the delivery thread, which owns
//! the one connection (see [`super::common::stream`] and its `deliver` module for the queue, the spool
//! and the stop protocol). Each call is bounded by `timeout_ms` (socket timeouts).
//!
//! Delivery: a batch is sent as one MULTI/EXEC transaction of XADDs: stored whole or not at
//! all, so a failure sends the whole batch again after a reconnect. Redis has no de-duplication:
//! a batch whose EXEC was applied but whose reply was lost arrives twice (at least once), with
//! the same `id` field, for consumers to drop. Each entry has the fields `id`, `source`,
//! `frame` and `payload` (the message: the `jsonl` line's JSON plus `schema`, `id`, `host`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use serde::Deserialize;
use toml::Spanned;

use super::common::net::{PASSWORD_FILE_DOC, ServerUrl};
use super::common::stream::{self, Delivery, Outgoing, Partial, Transport};
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::spec::{Diagnostic, ParamDoc, Params, Secret, SinkInput, read_password_file};

const OWN_DOCS: [ParamDoc; 7] = [
    ParamDoc {
        name: "url",
        ty: "string",
        default: "required",
        doc: "redis://[user:password@]host[:6379][/db] or rediss://... (TLS, system CA roots)",
    },
    ParamDoc {
        name: "key",
        ty: "string",
        default: "\"vidflow:{source}\"",
        doc: "the stream's key; {source} (one stream per camera) and {sink} are replaced",
    },
    ParamDoc {
        name: "maxlen",
        ty: "integer",
        default: "100000",
        doc: "trim each stream to about this many entries (XADD MAXLEN ~); 0: never trim",
    },
    ParamDoc {
        name: "username",
        ty: "string",
        default: "none",
        doc: "ACL user, with password_file",
    },
    PASSWORD_FILE_DOC,
    ParamDoc {
        name: "timeout_ms",
        ty: "integer >= 1",
        default: "5000",
        doc: "limit of a connect and of each reply",
    },
    stream::BATCH_DOC,
];

static PARAMS: [ParamDoc; 13] = stream::with_delivery_docs(OWN_DOCS);

pub(super) static KIND: SinkKind = SinkKind {
    name: "redis_stream",
    summary: "appends each frame's JSON to a Redis stream (XADD, trimmed), spooled to disk while the server is away",
    inputs: &[super::INCLUDE_PORT],
    params: &PARAMS,
    build,
};

/// `maxlen` when the file does not say.
const DEFAULT_MAXLEN: u64 = 100_000;
/// `timeout_ms` when the file does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: Spanned<String>,
    key: Option<Spanned<String>>,
    maxlen: Option<u64>,
    username: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    timeout_ms: Option<Spanned<u64>>,
    batch: Option<Spanned<usize>>,
}

/// Where to connect; the password apart, as a [`Secret`].
#[derive(Debug, Clone)]
struct Server {
    host: String,
    port: u16,
    tls: bool,
    db: i64,
    user: Option<String>,
    password: Option<Secret>,
    /// The URL as it may be shown.
    shown: String,
}

#[derive(Debug)]
struct Factory {
    server: Server,
    key: String,
    maxlen: u64,
    timeout: Duration,
    batch: usize,
    delivery: Delivery,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let (delivery, own) = Delivery::split(params)?;
    let c: Config = own.parse()?;
    let mut server = parse_url(c.url.get_ref()).map_err(|m| Diagnostic::at(c.url.span(), m))?;
    match (c.username, c.password_file) {
        (Some(u), _) if server.user.is_some() || server.password.is_some() => {
            return Err(Diagnostic::at(
                u.span(),
                "the url already has credentials; give them in one place",
            ));
        }
        (user, Some(f)) => {
            let password =
                read_password_file(f.get_ref()).map_err(|m| Diagnostic::at(f.span(), m))?;
            server.user = user.map(Spanned::into_inner);
            server.password = Some(Secret::new(password));
        }
        (Some(u), None) => {
            return Err(Diagnostic::at(u.span(), "username needs password_file"));
        }
        (None, None) => {}
    }
    let key = match c.key {
        Some(k) => {
            let bare = k.get_ref().replace("{source}", "").replace("{sink}", "");
            if k.get_ref().trim().is_empty() || bare.contains(['{', '}']) {
                return Err(Diagnostic::at(
                    k.span(),
                    format!(
                        "key \"{}\": not empty; the only placeholders are {{source}} and {{sink}}",
                        k.get_ref()
                    ),
                ));
            }
            k.into_inner()
        }
        None => "vidflow:{source}".to_owned(),
    };
    let timeout = match c.timeout_ms {
        Some(t) if *t.get_ref() == 0 => {
            return Err(Diagnostic::at(t.span(), "timeout_ms must be at least 1"));
        }
        Some(t) => Duration::from_millis(t.into_inner()),
        None => DEFAULT_TIMEOUT,
    };
    let batch = stream::batch(c.batch)?;
    Ok(Box::new(Factory {
        server,
        key,
        maxlen: c.maxlen.unwrap_or(DEFAULT_MAXLEN),
        timeout,
        batch,
        delivery,
    }))
}

/// `redis://[user[:password]@]host[:6379][/db]` or `rediss://`, parsed once ([`ServerUrl`]).
fn parse_url(url: &str) -> Result<Server, String> {
    let u = ServerUrl::parse(
        url,
        &["redis", "rediss"],
        &[],
        "redis://host[:port][/db] or rediss://...",
    )?;
    let db = match u.path() {
        "" => 0,
        n => n
            .parse()
            .map_err(|_| u.bad(&format!("the path is a database number, not \"{n}\"")))?,
    };
    let address = &u.address;
    Ok(Server {
        host: u.host.clone(),
        port: u.port.unwrap_or(6379),
        tls: u.scheme == "rediss",
        db,
        user: Some(address.user().to_owned()).filter(|user| !user.is_empty()),
        password: address.password().cloned(),
        shown: address.to_string(),
    })
}

impl SinkFactory for Factory {
    /// A server away must not slow the cameras (see the `nats` sink).
    fn default_on_full(&self) -> super::OnFull {
        super::OnFull::DropOldest
    }

    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        _storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let s = &self.server;
        let addr = if s.tls {
            ConnectionAddr::TcpTls {
                host: s.host.clone(),
                port: s.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(s.host.clone(), s.port)
        };
        let mut redis = RedisConnectionInfo::default().set_db(s.db);
        if let Some(user) = &s.user {
            redis = redis.set_username(user);
        }
        if let Some(p) = &s.password {
            redis = redis.set_password(p.expose());
        }
        let info = addr
            .into_connection_info()
            .map_err(|e| SinkError::Other(format!("redis_stream: {e}")))?
            .set_redis_settings(redis);
        let transport = Redis {
            info,
            connection: None,
            key: self.key.replace("{sink}", name),
            maxlen: self.maxlen,
            timeout: self.timeout,
            password: s.password.clone(),
        };
        stream::open(
            "redis_stream",
            name,
            inputs,
            &self.delivery,
            Box::new(transport),
            &s.shown,
            self.batch,
        )
    }
}

/// The delivery thread's connection.
struct Redis {
    info: ConnectionInfo,
    connection: Option<redis::Connection>,
    /// The key with `{sink}` replaced.
    key: String,
    maxlen: u64,
    timeout: Duration,
    /// To scrub from error messages.
    password: Option<Secret>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Redis {
    /// `timeout`, or less if `until` comes first (at least a millisecond).
    fn limit(&self, until: Option<Instant>) -> Duration {
        until
            .map_or(self.timeout, |u| {
                self.timeout
                    .min(u.saturating_duration_since(Instant::now()))
            })
            .max(Duration::from_millis(1))
    }

    fn scrub(&self, e: &redis::RedisError) -> String {
        let text = e.to_string();
        match &self.password {
            Some(p) => p.scrub(&text),
            None => text,
        }
    }
}

impl Transport for Redis {
    fn connect(&mut self, until: Option<Instant>) -> Result<(), String> {
        let limit = self.limit(until);
        let client = redis::Client::open(self.info.clone()).map_err(|e| self.scrub(&e))?;
        let connection = client
            .get_connection_with_timeout(limit)
            .map_err(|e| self.scrub(&e))?;
        self.connection = Some(connection);
        Ok(())
    }

    fn send(&mut self, batch: &[Outgoing], until: Option<Instant>) -> Result<(), Partial> {
        let limit = self.limit(until);
        let Some(connection) = self.connection.as_mut() else {
            return Err(Partial {
                acked: 0,
                error: "not connected".to_owned(),
                refused: false,
            });
        };
        let mut pipe = redis::pipe();
        pipe.atomic();
        for m in batch {
            let key = self.key.replace("{source}", &m.message.source);
            let cmd = pipe.cmd("XADD").arg(key);
            if self.maxlen > 0 {
                cmd.arg("MAXLEN").arg("~").arg(self.maxlen);
            }
            cmd.arg("*")
                .arg("id")
                .arg(&*m.id)
                .arg("source")
                .arg(&*m.message.source)
                .arg("frame")
                .arg(m.message.frame)
                .arg("payload")
                .arg(&m.message.body);
        }
        let timeouts = connection
            .set_read_timeout(Some(limit))
            .and_then(|()| connection.set_write_timeout(Some(limit)));
        let sent = timeouts.and_then(|()| pipe.query::<Vec<String>>(connection));
        match sent {
            Ok(_) => Ok(()),
            Err(e) => {
                // A reply that is an error (not a lost connection): the server refuses.
                let refused = e.kind() != redis::ErrorKind::Io
                    && !e.is_io_error()
                    && !e.is_timeout()
                    && !e.is_connection_dropped()
                    && !e.is_connection_refusal();
                Err(Partial {
                    acked: 0,
                    error: self.scrub(&e),
                    refused,
                })
            }
        }
    }

    fn disconnect(&mut self) {
        self.connection = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_db_and_a_hidden_password() {
        let s = parse_url("redis://default:hunter2@10.0.0.5:6380/3").unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.db, s.tls),
            ("10.0.0.5", 6380, 3, false)
        );
        assert_eq!(s.password.unwrap().expose(), "hunter2");
        assert_eq!(s.shown, "redis://default:***@10.0.0.5:6380/3");
        let s = parse_url("rediss://:p%40ss@cache.lan").unwrap();
        assert_eq!((s.port, s.tls, s.user), (6379, true, None));
        for (url, want) in [
            ("http://h", "unknown scheme"),
            ("redis://u:hunter2@h/x", "database number"),
            ("h:6379", "expected redis://"),
        ] {
            let e = parse_url(url).unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
