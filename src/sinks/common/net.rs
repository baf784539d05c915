//! What the network sinks (`mqtt`, `webhook`) share: the message of a frame (the same JSON as a
//! `jsonl` line), which frames they send (`mode`), the bounded backlog between the sink's thread
//! and the thread that delivers, the backoff between attempts, and how losses are told.
//!
//! Threads: the sink's own thread (`vidflow-sink-NAME`, see [`super::runner`]) only builds the
//! message and pushes it into the [`Backlog`]: that never waits on the network, so a broker or
//! server that is away never slows the workflow. The delivery thread of each kind takes messages
//! from there. Both share one mutex ([`Backlog::lock`]) and one condvar ([`Backlog::notify`]):
//! the sink's thread writes `waiting` and `closing`, the delivery thread takes from `waiting`
//! and writes the kind's own link state (`S`). A full backlog drops its oldest message (counted
//! and named at close).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::outcome::FrameResult;
use crate::sinks::SinkError;
use crate::sinks::jsonl::frame_json;
use crate::spec::{Address, AddressError, ParamDoc, SinkInput, redact};

/// Messages kept while the far end is away, when the pipeline file does not say (`backlog`).
const DEFAULT_BACKLOG: usize = 1000;

/// How long closing waits for the backlog to be delivered, when the file does not say
/// (`flush_timeout_ms`): inside the sinks' share (1/4) of the default 20 s stop deadline.
pub(in crate::sinks) const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(4);

/// First wait before another attempt; doubles up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between attempts: a broker back after an outage is found within this.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The `mode` parameter of every network sink.
pub(in crate::sinks) const MODE_DOC: ParamDoc = ParamDoc {
    name: "mode",
    ty: "\"frames\" | \"events\"",
    default: "\"frames\"",
    doc: "events: only frames where an included value is not empty",
};

/// The `password_file` parameter of the sinks that log in with a user.
pub(in crate::sinks) const PASSWORD_FILE_DOC: ParamDoc = ParamDoc {
    name: "password_file",
    ty: "path",
    default: "none",
    doc: "file holding the password (relative: in $CREDENTIALS_DIRECTORY if set)",
};

/// A server's URL, parsed once as an [`Address`]: the host and port connected to come from
/// the same parse as what is shown, and the password stays in it as a secret.
#[derive(Debug)]
pub(in crate::sinks) struct ServerUrl {
    pub scheme: String,
    /// The host, without an IPv6 address's brackets.
    pub host: String,
    pub port: Option<u16>,
    pub address: Address,
}

impl ServerUrl {
    /// Parses `url`, whose scheme must be one of `schemes` (or of `aliases`, not named in
    /// messages); `expected` says what a URL looks like, for the message. Messages quote the
    /// URL without its password.
    pub(in crate::sinks) fn parse(
        url: &str,
        schemes: &[&str],
        aliases: &[&str],
        expected: &str,
    ) -> Result<Self, String> {
        let bad = |why: &str| format!("url \"{}\": {why}", redact(url));
        let (scheme, _) = url
            .split_once("://")
            .ok_or_else(|| bad(&format!("expected {expected}")))?;
        if !schemes.contains(&scheme) && !aliases.contains(&scheme) {
            return Err(bad(&format!(
                "unknown scheme \"{scheme}\"; known: {}",
                schemes.join(", ")
            )));
        }
        let address = Address::parse(url).map_err(|e| match e {
            AddressError::NoHost { .. } => bad("no host"),
            e => e.to_string(),
        })?;
        let bare = address.without_credentials();
        if bare.query().is_some() || bare.fragment().is_some() {
            return Err(bad("a server url has no query"));
        }
        let host = bare.host_str().ok_or_else(|| bad("no host"))?;
        let port = match bare.port() {
            Some(0) => return Err(bad("bad port \"0\"")),
            port => port,
        };
        Ok(Self {
            scheme: scheme.to_owned(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            address,
        })
    }

    /// The path after the host, without its leading `/`.
    pub(in crate::sinks) fn path(&self) -> &str {
        self.address
            .without_credentials()
            .path()
            .trim_start_matches('/')
    }

    /// `message` about this URL, quoted without its password.
    pub(in crate::sinks) fn bad(&self, message: &str) -> String {
        format!("url \"{}\": {message}", self.address)
    }
}

/// Which frames a network sink sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(in crate::sinks) enum Mode {
    /// Every frame, like a `jsonl` line (a failed frame with its error).
    #[default]
    Frames,
    /// Only frames where an included value is not empty (a detection, a track, an event).
    Events,
}

/// One frame's message.
#[derive(Debug, Clone)]
pub(in crate::sinks) struct Message {
    pub source: Arc<str>,
    pub frame: u64,
    pub body: Vec<u8>,
}

/// Builds the message of a frame: the `jsonl` line (without its newline), or `None` when
/// `mode` leaves the frame out.
pub(in crate::sinks) fn message(
    result: &FrameResult,
    inputs: &[SinkInput],
    mode: Mode,
) -> Result<Option<Message>, SinkError> {
    if mode == Mode::Events && !crate::sinks::any_non_empty(result, inputs.iter().map(|i| i.from)) {
        return Ok(None);
    }
    let body = serde_json::to_vec(&frame_json(result, inputs))
        .map_err(|e| SinkError::Other(format!("cannot encode frame: {e}")))?;
    let frame = result.frame();
    Ok(Some(Message {
        source: frame.source.clone(),
        frame: frame.seq,
        body,
    }))
}

/// Messages that were not delivered: how many, and the first and last of them.
#[derive(Debug, Default)]
pub(in crate::sinks) struct Lost {
    pub count: u64,
    first: Option<(Arc<str>, u64)>,
    last: Option<(Arc<str>, u64)>,
}

impl Lost {
    pub(in crate::sinks) fn add(&mut self, m: &Message) {
        self.count += 1;
        let at = Some((m.source.clone(), m.frame));
        if self.first.is_none() {
            self.first = at.clone();
        }
        self.last = at;
    }

    /// Adds `later`'s messages (lost after these).
    pub(in crate::sinks) fn merge(&mut self, later: Lost) {
        self.count += later.count;
        if self.first.is_none() {
            self.first = later.first;
        }
        if later.last.is_some() {
            self.last = later.last;
        }
    }
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.count)?;
        if let (Some((s1, f1)), Some((s2, f2))) = (&self.first, &self.last) {
            if self.count == 1 {
                write!(f, " (source \"{s1}\" frame {f1})")?;
            } else {
                write!(
                    f,
                    " (from source \"{s1}\" frame {f1} to source \"{s2}\" frame {f2})"
                )?;
            }
        }
        Ok(())
    }
}

/// What a delivery thread and the sink's thread share under [`Backlog::lock`].
#[derive(Debug)]
pub(in crate::sinks) struct State<S> {
    /// Messages not handed to the network yet, oldest first.
    pub waiting: VecDeque<Message>,
    capacity: usize,
    /// Dropped because the backlog was full.
    pub overflow: Lost,
    /// Given up by the delivery thread (webhook: retries exhausted).
    pub failed: Lost,
    /// Set by closing: deliver what is left until `deadline`, then stop.
    pub closing: Option<Instant>,
    /// The kind's own link state, written by its delivery thread.
    pub link: S,
}

/// The bounded backlog of one network sink and the condvar that wakes its threads.
#[derive(Debug)]
pub(in crate::sinks) struct Backlog<S> {
    state: Mutex<State<S>>,
    changed: Condvar,
}

impl<S> Backlog<S> {
    pub(in crate::sinks) fn new(capacity: usize, link: S) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                capacity,
                overflow: Lost::default(),
                failed: Lost::default(),
                closing: None,
                link,
            }),
            changed: Condvar::new(),
        })
    }

    /// The shared state. A panic while it was held leaves it consistent (every change is one
    /// push or pop), so a poisoned lock is taken as it is.
    pub(in crate::sinks) fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the threads waiting in [`Backlog::wait`].
    pub(in crate::sinks) fn notify(&self) {
        self.changed.notify_all();
    }

    /// Waits for a change, at most until `until` (forever if `None`).
    pub(in crate::sinks) fn wait<'a>(
        &self,
        guard: MutexGuard<'a, State<S>>,
        until: Option<Instant>,
    ) -> MutexGuard<'a, State<S>> {
        match until {
            None => self
                .changed
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner),
            Some(t) => {
                let left = t.saturating_duration_since(Instant::now());
                self.changed
                    .wait_timeout(guard, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        }
    }

    /// Queues a message; a full backlog drops its oldest one.
    pub(in crate::sinks) fn push(&self, message: Message) {
        let mut state = self.lock();
        if state.waiting.len() >= state.capacity
            && let Some(old) = state.waiting.pop_front()
        {
            if state.overflow.count == 0 {
                tracing::warn!(
                    capacity = state.capacity,
                    "network sink backlog full; dropping the oldest messages"
                );
            }
            state.overflow.add(&old);
        }
        state.waiting.push_back(message);
        drop(state);
        self.notify();
    }
}

impl<S> State<S> {
    /// Whether closing has reached its deadline.
    pub(in crate::sinks) fn out_of_time(&self) -> bool {
        self.closing.is_some_and(|t| Instant::now() >= t)
    }
}

/// What closing reports: `Ok` if every message was delivered, else what was lost and why (the
/// daemon logs it with the sink's name and exits non-zero).
pub(in crate::sinks) fn losses(
    kind: &str,
    overflow: &Lost,
    failed: &Lost,
    at_stop: &Lost,
) -> Result<(), SinkError> {
    told_losses(
        kind,
        &[
            (overflow, "dropped while the backlog was full"),
            (failed, "given up after the retries"),
            (at_stop, "not delivered by the flush deadline"),
        ],
    )
}

/// Like [`losses`], with each kind of loss named by the caller.
pub(in crate::sinks) fn told_losses(kind: &str, lost: &[(&Lost, &str)]) -> Result<(), SinkError> {
    let parts: Vec<String> = lost
        .iter()
        .filter(|(l, _)| l.count > 0)
        .map(|(l, why)| format!("{l} {why}"))
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    Err(SinkError::Other(format!(
        "{kind}: messages lost: {}",
        parts.join("; ")
    )))
}

/// The `every_n_frames` parameter: at least 1, 1 (every frame) when not given.
pub(in crate::sinks) fn every_n_frames(
    given: Option<toml::Spanned<u64>>,
) -> Result<u64, crate::spec::Diagnostic> {
    match given {
        Some(n) if *n.get_ref() == 0 => Err(crate::spec::Diagnostic::at(
            n.span(),
            "every_n_frames must be at least 1",
        )),
        Some(n) => Ok(n.into_inner()),
        None => Ok(1),
    }
}

/// The `every_n_frames` parameter of the network sinks.
pub(in crate::sinks) const EVERY_N_FRAMES_DOC: ParamDoc = ParamDoc {
    name: "every_n_frames",
    ty: "integer >= 1",
    default: "1",
    doc: "send only frames whose number is a multiple of this",
};

/// The `backlog` parameter: at least 1, [`DEFAULT_BACKLOG`] when not given.
pub(in crate::sinks) fn backlog(
    given: Option<toml::Spanned<usize>>,
) -> Result<usize, crate::spec::Diagnostic> {
    match given {
        Some(b) if *b.get_ref() == 0 => Err(crate::spec::Diagnostic::at(
            b.span(),
            "backlog must be at least 1",
        )),
        Some(b) => Ok(b.into_inner()),
        None => Ok(DEFAULT_BACKLOG),
    }
}

/// Waits between attempts: doubling from [`BACKOFF_FIRST`] to [`BACKOFF_MAX`].
#[derive(Debug, Clone)]
pub(in crate::sinks) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    pub(in crate::sinks) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        d
    }

    pub(in crate::sinks) fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(frame: u64) -> Message {
        Message {
            source: "cam".into(),
            frame,
            body: Vec::new(),
        }
    }

    #[test]
    fn loiter_and_speeding_events_go_out_whole_and_count_as_events_in_events_mode() {
        use crate::outcome::{FrameRecord, Outcome};
        use crate::value::{BBox, Event, EventKind, Speed, Value};
        let mat = opencv::core::Mat::default();
        let frame = crate::frame::Frame::from_mat("cam".into(), 7, None, mat);
        let record = FrameRecord::new(Arc::new(frame), 1);
        let bbox = BBox {
            x: 1.0,
            y: 2.0,
            width: 3.0,
            height: 4.0,
        };
        let event = |kind| Event::new(kind, 5, "car".into(), "gate".into(), bbox);
        let events = vec![
            Event {
                dwell_s: Some(31.5),
                ..event(EventKind::Loiter)
            },
            Event {
                dwell_s: Some(2.0),
                speed: Some(Speed::Kmh(42.5)),
                ..event(EventKind::Speeding)
            },
        ];
        record.set_outcome(0, Outcome::Done(vec![Value::Events(events.into())]));
        let result = FrameResult::new(Arc::new(record));
        let inputs = [SinkInput {
            port: "include",
            label: "steps.zones.events".into(),
            from: crate::spec::Ref::Step { step: 0, output: 0 },
        }];
        let m = message(&result, &inputs, Mode::Events).unwrap().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        let box_ = serde_json::json!({"x": 1.0, "y": 2.0, "width": 3.0, "height": 4.0});
        assert_eq!(
            body["steps.zones.events"],
            serde_json::json!([
                {"event": "loiter", "track_id": 5, "class": "car", "place": "gate",
                 "box": box_, "dwell_s": 31.5},
                {"event": "speeding", "track_id": 5, "class": "car", "place": "gate",
                 "box": box_, "dwell_s": 2.0, "speed_kmh": 42.5},
            ])
        );
    }

    #[test]
    fn a_full_backlog_drops_the_oldest_and_names_them() {
        let b = Backlog::new(2, ());
        for f in 0..5 {
            b.push(msg(f));
        }
        let s = b.lock();
        let kept: Vec<u64> = s.waiting.iter().map(|m| m.frame).collect();
        assert_eq!(kept, [3, 4]);
        assert_eq!(
            s.overflow.to_string(),
            "3 (from source \"cam\" frame 0 to source \"cam\" frame 2)"
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let d: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        assert_eq!(d[0], BACKOFF_FIRST);
        assert_eq!(d[1], BACKOFF_FIRST * 2);
        assert_eq!(d[7], BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_FIRST);
    }

    #[test]
    fn nothing_lost_is_ok() {
        let none = Lost::default();
        assert!(losses("mqtt", &none, &none, &none).is_ok());
        let mut one = Lost::default();
        one.add(&msg(7));
        let e = losses("mqtt", &none, &none, &one).unwrap_err().to_string();
        assert!(
            e.contains("1 (source \"cam\" frame 7) not delivered"),
            "{e}"
        );
    }
}
