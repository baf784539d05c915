//! `nats`: publishes each frame's JSON to NATS JetStream (async-nats), with a header
//! `Nats-Msg-Id` that is the same if a message is sent twice, so the stream drops duplicates.
//!
//! Threads: the sink's thread and `vidflow-nats-NAME`, the delivery thread (see
//! [`super::common::stream`] and its `deliver` module for the queue, the spool and the stop protocol).
//! The delivery thread owns a current-thread tokio runtime: async-nats's connection task runs
//! on it only while that thread is inside it, which it is while connecting, while sending a
//! batch and while idle ([`Transport::idle`] waits inside the runtime on a `Notify` that the
//! sink's wake raises), so pings are answered even when no frame comes. No other thread.
//!
//! Delivery: a batch (`batch`) is published, then its acknowledgements are awaited in order
//! (each within `ack_timeout_ms`, the batch within the flush deadline at stop). What was not
//! acknowledged is published again after a reconnect; the stream's duplicate window drops the
//! copies of what was stored but not acknowledged. One subject per camera keeps its order:
//! after a failure, sending resumes at the oldest unacknowledged message. A client that loses
//! its server tries each listed server once, then gives up; the delivery thread reconnects
//! with a backoff (a connection per outage, so nothing queued in a dead client is sent later).

use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream::StorageType};
use async_nats::{ConnectOptions, HeaderMap, ServerAddr};

use super::common::net::PASSWORD_FILE_DOC;
use super::common::stream::{self, Outgoing, Partial, Transport, Wake};
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::spec::{ParamDoc, SinkInput};

mod config;

use config::{Auth, Factory, Tls, build};

const OWN_DOCS: [ParamDoc; 13] = [
    ParamDoc {
        name: "url",
        ty: "string",
        default: "required",
        doc: "nats://[user:password@]host[:4222] or tls://...; several, comma-separated, for a cluster",
    },
    ParamDoc {
        name: "subject",
        ty: "string",
        default: "\"vidflow.{source}.{sink}\"",
        doc: "subject; {source} and {sink} are replaced (one subject per camera keeps its order)",
    },
    ParamDoc {
        name: "stream",
        ty: "string",
        default: "none",
        doc: "a JetStream stream to create (file storage) if none has that name; else one must exist",
    },
    ParamDoc {
        name: "replicas",
        ty: "integer in [1, 5]",
        default: "1",
        doc: "replicas of the stream it creates (a cluster: 3 keeps a quorum with one node down)",
    },
    ParamDoc {
        name: "username",
        ty: "string",
        default: "none",
        doc: "user, with password_file",
    },
    PASSWORD_FILE_DOC,
    ParamDoc {
        name: "token_file",
        ty: "path",
        default: "none",
        doc: "file holding an auth token",
    },
    ParamDoc {
        name: "creds_file",
        ty: "path",
        default: "none",
        doc: "a .creds file (user JWT and nkey seed)",
    },
    ParamDoc {
        name: "tls_ca_file",
        ty: "path",
        default: "system roots",
        doc: "CA certificates (PEM) the server's certificate is checked against; implies TLS",
    },
    ParamDoc {
        name: "tls_cert_file",
        ty: "path",
        default: "none",
        doc: "client certificate (PEM), with tls_key_file",
    },
    ParamDoc {
        name: "tls_key_file",
        ty: "path",
        default: "none",
        doc: "client key (PEM)",
    },
    ParamDoc {
        name: "ack_timeout_ms",
        ty: "integer",
        default: "5000",
        doc: "how long to wait for the stream's acknowledgement of a message",
    },
    stream::BATCH_DOC,
];

static PARAMS: [ParamDoc; 19] = stream::with_delivery_docs(OWN_DOCS);

pub(super) static KIND: SinkKind = SinkKind {
    name: "nats",
    summary: "publishes each frame's JSON to NATS JetStream, de-duplicated by id, spooled to disk while the server is away",
    inputs: &[super::INCLUDE_PORT],
    params: &PARAMS,
    build,
};

/// How long one connection attempt may take (a silent host is retried after it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl SinkFactory for Factory {
    /// A server away must not slow the cameras: results go to the backlog and spool; only if
    /// the sink's own thread falls behind does its queue drop its oldest (counted).
    fn default_on_full(&self) -> super::OnFull {
        super::OnFull::DropOldest
    }

    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        _storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SinkError::Other(format!("nats: cannot start a runtime: {e}")))?;
        let servers = self
            .servers
            .iter()
            .map(|s| s.parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SinkError::Other(format!("nats: {e}")))?;
        let notify = Arc::new(tokio::sync::Notify::new());
        let stream = self.stream.as_ref().map(|(stream, replicas)| {
            let subjects = self
                .subject
                .replace("{source}", "*")
                .replace("{sink}", name);
            (stream.clone(), subjects, *replicas)
        });
        let transport = Nats {
            runtime,
            servers,
            auth: self.auth.clone(),
            tls: self.tls.clone(),
            client_name: format!("vidflow-{name}"),
            subject: self.subject.replace("{sink}", name),
            stream,
            ack_timeout: self.ack_timeout,
            context: None,
            notify,
            closing: Arc::default(),
            reorder_told: false,
        };
        stream::open(
            "nats",
            name,
            inputs,
            &self.delivery,
            Box::new(transport),
            &self.shown,
            self.batch,
        )
    }
}

/// The delivery thread's NATS client (see the module header).
struct Nats {
    runtime: tokio::runtime::Runtime,
    servers: Vec<ServerAddr>,
    auth: Auth,
    tls: Tls,
    client_name: String,
    /// The subject with `{sink}` replaced.
    subject: String,
    /// A stream to create if missing: name, subjects, replicas.
    stream: Option<(String, String, usize)>,
    ack_timeout: Duration,
    context: Option<jetstream::Context>,
    /// Wakes [`Transport::idle`] inside the runtime.
    notify: Arc<tokio::sync::Notify>,
    /// Set by closing: the flush deadline, and a wake-up for a call under way.
    closing: Arc<(std::sync::Mutex<Option<Instant>>, tokio::sync::Notify)>,
    reorder_told: bool,
}

/// `until`, or far enough away to mean never.
fn deadline(until: Option<Instant>) -> tokio::time::Instant {
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    tokio::time::Instant::from_std(until.unwrap_or(far))
}

impl Nats {
    /// Runs `work` on the runtime until it ends or the flush deadline passes; `None` then.
    /// The deadline may be set while `work` runs (closing began).
    fn bounded<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let closing = self.closing.clone();
        self.runtime.block_on(async move {
            let mut work = std::pin::pin!(work);
            loop {
                let wait_close = closing.1.notified();
                let deadline = *closing.0.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(d) = deadline {
                    return tokio::time::timeout_at(d.into(), work).await.ok();
                }
                tokio::select! {
                    r = &mut work => return Some(r),
                    () = wait_close => {}
                }
            }
        })
    }

    fn options(&self) -> Result<ConnectOptions, String> {
        let mut o = ConnectOptions::new()
            .name(&self.client_name)
            .connection_timeout(CONNECT_TIMEOUT)
            // One try of each server after a lost connection, then the client closes and
            // the delivery thread reconnects (see the module header).
            .max_reconnects(self.servers.len())
            .reconnect_delay_callback(|_| Duration::ZERO)
            .ignore_discovered_servers();
        o = match &self.auth {
            Auth::None => o,
            Auth::Password(user, p) => o.user_and_password(user.clone(), p.expose().to_owned()),
            Auth::Token(t) => o.token(t.expose().to_owned()),
            Auth::Creds(c) => o
                .credentials(c.expose())
                .map_err(|e| format!("creds_file: {}", self.auth.scrub(&e.to_string())))?,
        };
        if self.tls.required {
            o = o.require_tls(true);
        }
        if let Some(ca) = &self.tls.ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.cert {
            o = o.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(o)
    }
}

impl Transport for Nats {
    fn connect(&mut self, _until: Option<Instant>) -> Result<(), String> {
        let options = self.options()?;
        let servers = self.servers.clone();
        // Made once: later reconnects need only the stream's leader, not JetStream's API
        // (whose own leader may be the node that went away).
        let stream = self.stream.take();
        let ack_timeout = self.ack_timeout;
        let attempt = async move {
            let client = match options.connect(servers).await {
                Ok(c) => c,
                Err(e) => return Err((e.to_string(), stream)),
            };
            let mut context = jetstream::new(client);
            context.set_timeout(ack_timeout);
            if let Some((name, subjects, replicas)) = &stream {
                let made = context
                    .get_or_create_stream(jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![subjects.clone()],
                        storage: StorageType::File,
                        num_replicas: *replicas,
                        ..Default::default()
                    })
                    .await;
                if let Err(e) = made {
                    return Err((format!("stream \"{name}\": {e}"), stream));
                }
            }
            Ok(context)
        };
        match self.bounded(attempt) {
            Some(Ok(context)) => {
                self.context = Some(context);
                Ok(())
            }
            Some(Err((e, stream))) => {
                self.stream = stream;
                Err(self.auth.scrub(&e))
            }
            None => Err("flush deadline reached while connecting".to_owned()),
        }
    }

    fn send(&mut self, batch: &[Outgoing], _until: Option<Instant>) -> Result<(), Partial> {
        let Some(context) = self.context.clone() else {
            return Err(Partial {
                acked: 0,
                error: "not connected".to_owned(),
                refused: false,
            });
        };
        let subject = &self.subject;
        let work = async {
            let mut acks = Vec::with_capacity(batch.len());
            let mut failed = None;
            for m in batch {
                let mut headers = HeaderMap::new();
                headers.insert("Nats-Msg-Id", &*m.id);
                let subject = subject.replace("{source}", &m.message.source);
                let body = bytes::Bytes::from(m.message.body.clone());
                match context.publish_with_headers(subject, headers, body).await {
                    Ok(ack) => acks.push(ack),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            // Acknowledgements in order: the first failure ends the acknowledged prefix.
            let mut acked = 0;
            let mut first_error = None;
            let mut later_stored = false;
            for ack in acks {
                match ack.await {
                    Ok(a) if first_error.is_none() => {
                        if a.duplicate {
                            tracing::debug!(seq = a.sequence, "nats: acknowledged as a duplicate");
                        }
                        acked += 1;
                    }
                    Ok(_) => later_stored = true,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            match first_error.or(failed) {
                None => Ok(()),
                Some(e) => {
                    let refused = matches!(
                        e.kind(),
                        jetstream::context::PublishErrorKind::MaxPayloadExceeded
                    );
                    Err((acked, e.to_string(), refused, later_stored))
                }
            }
        };
        match self.bounded(work) {
            Some(Ok(())) => Ok(()),
            Some(Err((acked, error, refused, later_stored))) => {
                if later_stored && !self.reorder_told {
                    self.reorder_told = true;
                    tracing::warn!(
                        error = %error,
                        "nats: a message failed after a later one was stored; it is sent again \
                         and lands after it (a cluster changing leader; batch = 1 avoids this)"
                    );
                }
                Err(Partial {
                    acked,
                    error: self.auth.scrub(&error),
                    refused,
                })
            }
            None => Err(Partial {
                acked: 0,
                error: "flush deadline reached while sending".to_owned(),
                refused: false,
            }),
        }
    }

    fn disconnect(&mut self) {
        // Dropping the last handle closes the client; its task ends inside the runtime.
        self.context = None;
    }

    fn attach(&mut self, wake: &Wake) {
        let notify = self.notify.clone();
        wake.set_hook(Box::new(move || notify.notify_one()));
        let closing = self.closing.clone();
        wake.set_close_hook(Box::new(move |deadline| {
            *closing.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(deadline);
            closing.1.notify_one();
        }));
    }

    fn idle(&mut self, _wake: &Wake, until: Option<Instant>) {
        let notify = self.notify.clone();
        self.runtime.block_on(async move {
            let _ = tokio::time::timeout_at(deadline(until), notify.notified()).await;
        });
    }
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("servers", &self.servers.len())
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}
