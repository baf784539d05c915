//! The event store (`[events] path = "events.db"`): what happened, in SQLite, for the page and
//! the JSON API. It sits beside the other outputs and replaces none: JSONL stays the raw record.
//!
//! Rows: an `events` row per track seen (from its first frame to its last), zone enter and
//! leave, line crossing and stretch of motion, with its source, step, label, track id, score,
//! zone or line, and the snapshot and clip (files of the `snapshot` and `clip` sinks) that show
//! it; a `counts` row per source, line or zone, direction and minute; an `occupancy` row per
//! zone and minute and a `heatmap` row per source, label and minute (`heat.rs`).
//!
//! Times are frame times (`time.rs`): a row starts and ends at its frames' times, and a track
//! or stretch of motion ends when its source's frames have gone on for some seconds of their
//! own time without it (seen again later, it starts a new row), however late or slowly they
//! were delivered.
//!
//! Threads: one, `vidflow-events`, owns the only writing connection (`writer.rs`). The frame
//! path (the executor's delivery callback) only clones a frame's `Arc`ed values into a
//! [`Facts`] and `try_send`s it on a bounded channel of [`QUEUE`] frames: when the writer is
//! behind (a slow disk, a locked database) the frame's facts are dropped and counted, never
//! waited for. A frame with no facts is not sent, unless it is the first after its source
//! reconnected (where its timestamps are placed again, `time.rs`); one lost to a full queue
//! loses nothing and is not counted. The writer takes what is queued, writes it in one
//! transaction, and every [`writer::LINK_INTERVAL`] names the snapshots and clips made for
//! recent events by the sinks that trigger on them (`link.rs`). A database that is missing, locked or corrupt never stops the frames: the failure
//! is counted and logged once, the connection dropped, and the file reopened (a corrupt one set
//! aside as `NAME.corrupt-TIME` and recreated) after [`writer::REOPEN_DELAY`]; what comes
//! meanwhile is counted as dropped.
//!
//! Readers (the HTTP API's threads) open their own read-only connections (`query.rs`); WAL
//! keeps them and the writer from blocking each other.
//!
//! Stop protocol: [`EventStore::stop`] (after the executor has delivered its last frame) sends
//! `Stop` behind what is queued; the writer writes it all, closes open tracks and motion at
//! their last time, and ends; it is joined.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Sender, TrySendError};
use serde::Serialize;

use crate::frame::{Place, Placement};
use crate::outcome::FrameResult;
use crate::spec::Ref;
use crate::storage::Storage;
use crate::value::{Counts, Event, Track, Value};

mod counts;
pub mod heat;
mod identity;
mod link;
mod params;
pub mod query;
pub mod schema;
mod time;
mod writer;
pub mod zones;

pub use time::FrameTime;

/// Frames of facts queued for the writer: some seconds of a few cameras, so a commit that
/// waits for the disk now and then loses nothing.
pub const QUEUE: usize = 1024;
/// Default `retain_days`.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(30 * 86_400);

/// `[events]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsConfig {
    pub path: PathBuf,
    /// Rows older than this are deleted (the files they name follow their sinks' retention).
    pub retain: Duration,
}

/// What a frame's values mean to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// A tracker's tracks: each new id is a "track" event.
    Tracks,
    /// Zone and line events (and a count per minute).
    Events,
    /// A motion step's regions: a stretch of frames with some is a "motion" event.
    Motion,
    /// A `zone_count` step's counts: objects inside each zone now (occupancy).
    Occupancy,
}

/// One output the store reads, with its step's name.
#[derive(Debug, Clone)]
pub struct Output {
    pub step: Arc<str>,
    pub at: Ref,
    pub tap: Tap,
    /// The sinks whose `when` reads it: the snapshots and clips they make for a frame with
    /// events are those events' (see `writer::link`).
    pub sinks: Arc<[Arc<str>]>,
    /// How the image its boxes were found in lies on the frame (`Graph::placements`): the
    /// heatmap is over the frame.
    pub placed: Arc<[Placement]>,
}

/// A step's name, its events on a frame, and the sinks that make files for them.
pub type StepEvents = (Arc<str>, Arc<[Event]>, Arc<[Arc<str>]>);

/// One frame's facts, as the writer gets them (`Arc` clones of the frame's values).
#[derive(Debug)]
pub struct Facts {
    pub source: Arc<str>,
    /// The frame's number in its source.
    pub seq: u64,
    pub time: FrameTime,
    /// Each with where the image its boxes were found in lies on the frame.
    pub tracks: Vec<(Arc<str>, Arc<[Track]>, Place)>,
    /// A step's events, with the sinks that make files for them ([`Output::sinks`]).
    pub events: Vec<StepEvents>,
    /// Motion steps with regions on this frame.
    pub motion: Vec<Arc<str>>,
    /// `zone_count` steps' objects inside each zone on this frame.
    pub occupancy: Vec<(Arc<str>, Arc<Counts>)>,
    /// The frame's width and height (heatmap cells are fractions of them).
    pub size: (i32, i32),
    /// The frame's time in its stream, seconds (`Frame::stream_time_s`): its time step is
    /// the time since its source's previous facts.
    pub stream_s: f64,
    /// The frame's nominal interval (1 / fps), seconds; 0 when the source gives no rate.
    pub interval_s: f64,
    /// A tracker or `zone_count` ran on the frame (it is sent even without tracks: the next
    /// frame's time step starts at it).
    pub sampled: bool,
}

impl Facts {
    /// What `result` holds for the outputs in `taps`, if the writer is to be told (see the
    /// module header).
    fn of(result: &FrameResult, taps: &[Output]) -> Option<Self> {
        let frame = result.frame();
        let mut facts = Self {
            source: frame.source.clone(),
            seq: frame.seq,
            time: FrameTime::of(frame),
            tracks: Vec::new(),
            events: Vec::new(),
            motion: Vec::new(),
            occupancy: Vec::new(),
            size: (frame.width(), frame.height()),
            stream_s: frame.stream_time_s(),
            interval_s: frame
                .fps
                .filter(|&(n, d)| n > 0 && d > 0)
                .map_or(0.0, |(n, d)| f64::from(d) / f64::from(n)),
            sampled: false,
        };
        for out in taps {
            match (out.tap, result.value(out.at)) {
                (Tap::Tracks, Some(Value::Tracks(t))) => {
                    facts.sampled = true;
                    if !t.is_empty() {
                        let place = Place::of(&out.placed, facts.size.0, facts.size.1);
                        facts.tracks.push((out.step.clone(), t, place));
                    }
                }
                (Tap::Occupancy, Some(Value::Counts(c))) => {
                    facts.sampled = true;
                    facts.occupancy.push((out.step.clone(), c));
                }
                (Tap::Events, Some(Value::Events(e))) if !e.is_empty() => {
                    facts.events.push((out.step.clone(), e, out.sinks.clone()));
                }
                (Tap::Motion, Some(Value::Detections(d))) if !d.is_empty() => {
                    facts.motion.push(out.step.clone());
                }
                _ => {}
            }
        }
        // Rows end by the frame time of their source's next facts: an empty frame tells the
        // writer nothing, unless a tracker or `zone_count` ran on it or it is the first after
        // a reconnection.
        (!facts.is_empty() || facts.time.reconnected || facts.sampled).then_some(facts)
    }

    /// Only its frame's time (see the module header).
    fn is_empty(&self) -> bool {
        self.tracks.is_empty()
            && self.events.is_empty()
            && self.motion.is_empty()
            && self.occupancy.is_empty()
    }
}

#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "Stop comes once; a boxed Facts would be an allocation per frame on the frame path"
)]
enum Msg {
    Facts(Facts),
    Stop,
}

/// The store's counters, for `/metrics` and the API.
#[derive(Debug, Default, Serialize)]
pub struct Counters {
    /// Events rows written.
    pub events: AtomicU64,
    /// Frames whose facts were not written: the queue was full, or the database was down.
    pub dropped: AtomicU64,
    /// Failures of the database (opening, writing).
    pub errors: AtomicU64,
    /// Times the database was reopened after a failure (or recreated, corrupt).
    pub reopened: AtomicU64,
}

/// The running store; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventStore {
    tx: Sender<Msg>,
    pub counters: Arc<Counters>,
    pub path: PathBuf,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl EventStore {
    /// Starts the writer thread (the database is opened there: a bad one never fails the run).
    pub fn start(config: &EventsConfig, storage: Storage) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let counters = Arc::new(Counters::default());
        let writer = writer::Writer::new(config.clone(), storage, counters.clone());
        let thread = std::thread::Builder::new()
            .name("vidflow-events".to_owned())
            .spawn(move || writer.run(&rx))?;
        Ok(Self {
            tx,
            counters,
            path: config.path.clone(),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// Queues what `result` holds for the outputs in `taps` (nothing if it holds nothing);
    /// never blocks.
    pub fn record(&self, result: &FrameResult, taps: &[Output]) {
        let Some(facts) = Facts::of(result, taps) else {
            return;
        };
        let empty = facts.is_empty();
        match self.tx.try_send(Msg::Facts(facts)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) if !empty => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Writes what is queued, closes what is open and joins the writer.
    pub fn stop(&self) {
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = self.tx.send(Msg::Stop);
            let _ = thread.join();
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
