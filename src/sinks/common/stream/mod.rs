//! What the stream sinks (`nats`, `redis_stream`) share: the message of a frame (the `jsonl`
//! line's JSON plus a schema version, the host name and an id that is the same if it is sent
//! twice), which frames they send (`mode`, `every_n_frames`), the delivery settings, and the
//! sink itself: a [`Queue`] of memory backlog and disk spool, drained by a delivery thread.
//!
//! Threads: the sink's own thread (`vidflow-sink-NAME`, see [`super::runner`]) builds each
//! message and pushes it into the queue (writing to the spool when the memory backlog is full:
//! local disk, never the network); `vidflow-KIND-NAME` delivers (see [`deliver`]). The queue is
//! shared under one mutex; the stop protocol is [`deliver`]'s.
//!
//! The id: `HOST:SOURCE:RUN:FRAME`, where RUN names this process (its start time and pid) and
//! gets a `.N` suffix if a source's frame numbers start over within it (a source removed and
//! added again by a reload). A message replayed from the spool keeps the id it was made with.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use toml::Spanned;

use crate::outcome::FrameResult;
use crate::sinks::common::net::{self, Message, Mode};
use crate::sinks::jsonl::frame_json;
use crate::sinks::{Sink, SinkError};
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};

mod deliver;
mod queue;
mod spool;

use deliver::{JOIN_GRACE, Label, Shared};
pub(in crate::sinks) use deliver::{Partial, Transport, Wake};
use queue::Queue;
use spool::Spool;

/// The version of the payload's layout (`schema`): raised when a field changes meaning.
pub(in crate::sinks) const SCHEMA: u32 = 1;

/// `spool_mb` when the file does not say.
const DEFAULT_SPOOL_MB: u64 = 256;
/// The largest `spool_mb`: a terabyte.
const MAX_SPOOL_MB: u64 = 1 << 20;

/// One message on its way: its id and the frame's message (the payload as `body`).
#[derive(Debug, Clone)]
pub(in crate::sinks) struct Outgoing {
    pub id: Arc<str>,
    pub message: Message,
}

/// The parameters every stream sink takes, split off from its own (see [`Params::split`]).
pub(in crate::sinks) const DELIVERY_KEYS: &[&str] = &[
    "mode",
    "every_n_frames",
    "backlog",
    "spool_mb",
    "spool_dir",
    "flush_timeout_ms",
];

/// Their documentation, after each kind's own.
pub(in crate::sinks) const DELIVERY_DOCS: [ParamDoc; 6] = [
    net::MODE_DOC,
    net::EVERY_N_FRAMES_DOC,
    ParamDoc {
        name: "backlog",
        ty: "integer >= 1",
        default: "1000",
        doc: "messages kept in memory while the server is away; then they go to the spool",
    },
    ParamDoc {
        name: "spool_mb",
        ty: "integer in [0, 1048576]",
        default: "256",
        doc: "disk spool for a longer outage and for what is left at a stop, replayed in order; \
              when full its oldest are dropped (counted); 0: none",
    },
    ParamDoc {
        name: "spool_dir",
        ty: "path",
        default: "\"spool/{sink}\"",
        doc: "the spool's folder (relative: to the working directory, /var/lib/vidflow under \
              systemd); one per sink",
    },
    ParamDoc {
        name: "flush_timeout_ms",
        ty: "integer",
        default: "4000",
        doc: "at stop, how long to deliver the backlog; what is left goes to the spool, or is lost",
    },
];

/// A kind's own parameter docs followed by [`DELIVERY_DOCS`] (`M` = `N` + 6).
pub(in crate::sinks) const fn with_delivery_docs<const N: usize, const M: usize>(
    own: [ParamDoc; N],
) -> [ParamDoc; M] {
    assert!(M == N + DELIVERY_DOCS.len(), "M must be N + 6");
    let mut out = [DELIVERY_DOCS[0]; M];
    let mut i = 0;
    while i < M {
        out[i] = if i < N { own[i] } else { DELIVERY_DOCS[i - N] };
        i += 1;
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryConfig {
    #[serde(default)]
    mode: Mode,
    every_n_frames: Option<Spanned<u64>>,
    backlog: Option<Spanned<usize>>,
    spool_mb: Option<Spanned<u64>>,
    spool_dir: Option<Spanned<String>>,
    flush_timeout_ms: Option<u64>,
}

/// How a stream sink delivers (the settings of [`DELIVERY_KEYS`]).
#[derive(Debug, Clone)]
pub(in crate::sinks) struct Delivery {
    mode: Mode,
    every: u64,
    backlog: usize,
    /// `None`: no spool.
    spool_bytes: Option<u64>,
    /// The folder, `{sink}` not yet replaced.
    spool_dir: String,
    flush_timeout: Duration,
}

impl Delivery {
    /// Parses the delivery settings out of `params`; returns them and the kind's own.
    pub(in crate::sinks) fn split(params: Params<'_>) -> Result<(Self, Params<'_>), Diagnostic> {
        let (mine, rest) = params.split(DELIVERY_KEYS);
        let c: DeliveryConfig = mine.parse()?;
        let every = net::every_n_frames(c.every_n_frames)?;
        let backlog = net::backlog(c.backlog)?;
        let spool_bytes = match c.spool_mb {
            Some(mb) if *mb.get_ref() > MAX_SPOOL_MB => {
                return Err(Diagnostic::at(
                    mb.span(),
                    format!("spool_mb must be at most {MAX_SPOOL_MB}"),
                ));
            }
            Some(mb) if *mb.get_ref() == 0 => None,
            Some(mb) => Some(mb.into_inner() << 20),
            None => Some(DEFAULT_SPOOL_MB << 20),
        };
        let spool_dir = match c.spool_dir {
            Some(d) if d.get_ref().trim().is_empty() => {
                return Err(Diagnostic::at(d.span(), "spool_dir is empty"));
            }
            Some(d) => d.into_inner(),
            None => "spool/{sink}".to_owned(),
        };
        let flush_timeout = c
            .flush_timeout_ms
            .map_or(net::DEFAULT_FLUSH_TIMEOUT, Duration::from_millis);
        Ok((
            Self {
                mode: c.mode,
                every,
                backlog,
                spool_bytes,
                spool_dir,
                flush_timeout,
            },
            rest,
        ))
    }
}

/// The `batch` parameter of every stream sink.
pub(in crate::sinks) const BATCH_DOC: ParamDoc = ParamDoc {
    name: "batch",
    ty: "integer in [1, 4096]",
    default: "256",
    doc: "messages sent at once before their acknowledgement is awaited (1: one at a time)",
};

/// `batch` when the file does not say: messages sent before their acknowledgements are awaited.
const DEFAULT_BATCH: usize = 256;

/// The `batch` parameter of a stream sink: 1 to 4096, [`DEFAULT_BATCH`] when not given.
pub(in crate::sinks) fn batch(given: Option<Spanned<usize>>) -> Result<usize, Diagnostic> {
    match given {
        Some(b) if !(1..=4096).contains(b.get_ref()) => {
            Err(Diagnostic::at(b.span(), "batch must be between 1 and 4096"))
        }
        Some(b) => Ok(b.into_inner()),
        None => Ok(DEFAULT_BATCH),
    }
}

/// This process's part of every id: its start (ms since 1970, hex) and pid.
fn run_id() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!("{ms:x}.{}", std::process::id())
    })
}

/// The machine's host name (`gethostname`), or "localhost" if it has none.
pub(in crate::sinks) fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is valid for writes of its length; gethostname writes at most that many
        // bytes and we read only up to the first NUL within the buffer.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        match (rc, std::str::from_utf8(&buf[..end])) {
            (0, Ok(name)) if !name.is_empty() => name.to_owned(),
            _ => "localhost".to_owned(),
        }
    })
}

/// Makes the messages of one sink: ids that stay the same when sent again.
#[derive(Debug)]
struct Envelope {
    host: &'static str,
    run: &'static str,
    /// Per source: the last frame number seen and how often numbers started over.
    seen: HashMap<Arc<str>, (u64, u32)>,
}

impl Envelope {
    fn new() -> Self {
        Self {
            host: host_name(),
            run: run_id(),
            seen: HashMap::new(),
        }
    }

    fn id(&mut self, source: &Arc<str>, frame: u64) -> String {
        let restarts = match self.seen.get_mut(source) {
            Some((last, restarts)) => {
                if frame <= *last {
                    *restarts += 1;
                }
                *last = frame;
                *restarts
            }
            None => {
                self.seen.insert(source.clone(), (frame, 0));
                0
            }
        };
        match restarts {
            0 => format!("{}:{source}:{}:{frame}", self.host, self.run),
            n => format!("{}:{source}:{}.{n}:{frame}", self.host, self.run),
        }
    }

    /// The payload of a frame: `schema`, `id`, `host`, then the `jsonl` line's fields.
    fn message(
        &mut self,
        result: &FrameResult,
        inputs: &[SinkInput],
    ) -> Result<Outgoing, SinkError> {
        let frame = result.frame();
        let id = self.id(&frame.source, frame.seq);
        let mut payload = Map::new();
        payload.insert("schema".into(), json!(SCHEMA));
        payload.insert("id".into(), json!(id));
        payload.insert("host".into(), json!(self.host));
        if let Json::Object(fields) = frame_json(result, inputs) {
            payload.extend(fields);
        }
        let body = serde_json::to_vec(&payload)
            .map_err(|e| SinkError::Other(format!("cannot encode frame: {e}")))?;
        Ok(Outgoing {
            id: id.into(),
            message: Message {
                source: frame.source.clone(),
                frame: frame.seq,
                body,
            },
        })
    }
}

/// Starts a stream sink: opens its spool, spawns its delivery thread over `transport`.
pub(in crate::sinks) fn open(
    kind: &'static str,
    name: &str,
    inputs: &[SinkInput],
    delivery: &Delivery,
    transport: Box<dyn Transport>,
    server: &str,
    batch: usize,
) -> Result<Box<dyn Sink>, SinkError> {
    let spool = match delivery.spool_bytes {
        Some(bytes) => {
            let dir = PathBuf::from(delivery.spool_dir.replace("{sink}", name));
            let spool = Spool::open(&dir, bytes).map_err(|e| SinkError::Other(e.to_string()))?;
            if spool.len() > 0 {
                tracing::info!(
                    sink = %name,
                    spool = %dir.display(),
                    messages = spool.len(),
                    "{kind}: replaying the spool left by an earlier run"
                );
            }
            Some(spool)
        }
        None => None,
    };
    let shared = Shared::new(Queue::new(delivery.backlog, spool));
    let label = Label {
        kind,
        sink: name.to_owned(),
        server: server.to_owned(),
    };
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let thread = {
        let shared = shared.clone();
        let label = label.clone();
        std::thread::Builder::new()
            .name(format!("vidflow-{kind}-{name}"))
            .spawn(move || deliver::deliver(transport, &shared, &label, batch, &done_tx))
            .map_err(|e| SinkError::Other(format!("cannot spawn {kind} thread: {e}")))?
    };
    // Wake the thread once: a spool from an earlier run is sent without waiting for a frame.
    shared.wake.raise();
    tracing::info!(sink = %name, server = %server, "{kind} sink started");
    Ok(Box::new(StreamSink {
        label,
        inputs: inputs.to_vec(),
        mode: delivery.mode,
        every: delivery.every,
        envelope: Envelope::new(),
        shared,
        flush_timeout: delivery.flush_timeout,
        done,
        thread: Some(thread),
    }))
}

/// A running stream sink (see the module header).
#[derive(Debug)]
struct StreamSink {
    label: Label,
    inputs: Vec<SinkInput>,
    mode: Mode,
    every: u64,
    envelope: Envelope,
    shared: Arc<Shared>,
    flush_timeout: Duration,
    done: crossbeam_channel::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Sink for StreamSink {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        if !result.frame().seq.is_multiple_of(self.every) {
            return Ok(false);
        }
        if self.mode == Mode::Events
            && !crate::sinks::any_non_empty(result, self.inputs.iter().map(|i| i.from))
        {
            return Ok(false);
        }
        let m = self.envelope.message(result, &self.inputs)?;
        self.shared.lock().queue.push(m);
        self.shared.wake.raise();
        Ok(true)
    }

    fn close(mut self: Box<Self>) -> Result<(), SinkError> {
        let deadline = Instant::now() + self.flush_timeout;
        self.shared.lock().closing = Some(deadline);
        self.shared.wake.close(deadline);
        let finished = self.done.recv_deadline(deadline + JOIN_GRACE).is_ok();
        let mut state = self.shared.lock();
        state.stop = true;
        let queue = std::mem::replace(&mut state.queue, Queue::new(1, None));
        let refused = std::mem::take(&mut state.refused);
        drop(state);
        self.shared.wake.raise();
        let closed = queue.close();
        let (kind, name) = (self.label.kind, &self.label.sink);
        if closed.kept > 0 {
            tracing::warn!(
                sink = %name,
                messages = closed.kept,
                "{kind}: undelivered messages are kept in the spool for the next run"
            );
        }
        match self.thread.take() {
            Some(t) if finished => {
                let _ = t.join();
            }
            _ => tracing::warn!(sink = %name, "{kind} delivery still under way; detached"),
        }
        net::told_losses(
            kind,
            &[
                (
                    &closed.overflow,
                    "dropped while the backlog and spool were full",
                ),
                (&refused, "refused by the server"),
                (
                    &closed.spool_failed,
                    "not written to the spool (disk error)",
                ),
                (&closed.at_stop, "not delivered by the flush deadline"),
            ],
        )
    }
}
