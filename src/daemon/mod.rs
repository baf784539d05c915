//! Assembles source -> executor -> sinks for one run, and takes it down in order.
//!
//! Threads: the caller's thread starts everything, then waits for stop requests and for the
//! executor, whose coordinator runs on a `vidflow-executor` thread; each source has its
//! supervisor (and GStreamer's streaming threads), the pool its workers, each sink its own
//! thread; under systemd, `vidflow-notify` reports to it (`notify/`), from the moment the
//! run's parts are shown until the sinks are closed.
//!
//! Shutdown order, whatever ends the run (end of stream, a stop request, a source error, a
//! step error with `on_step_error = "stop"`):
//! 1. the source is stopped (EOS; it still delivers what it decoded),
//! 2. every admitted frame is drained through the workflow and delivered to the sinks,
//! 3. the pool is shut down and its threads joined,
//! 4. the sinks are closed (files finalized), even if an earlier stage failed.
//!
//! A second stop request stops at once: no new frame is admitted, frames still queued are
//! counted as dropped, the sources are stopped hard, frames in flight get one second (then they
//! are given up and counted as dropped, their workers left to finish on their own), and the
//! sinks are still closed with their share of the deadline, so the files they wrote stay valid.
//! What is given up on that request is logged, not an error: the exit code stays 0 unless a
//! source or a sink had to be abandoned.
//!
//! The stop deadline (`[daemon] stop_timeout_s`, from the first stop request or the end of the
//! run) bounds all four steps: what has not finished by then is abandoned, never waited for,
//! counted (frames as dropped) and named in the log, and the run fails with
//! [`DaemonError::StopDeadline`] (exit 70). See `shutdown.rs` for the shares of the deadline.

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;

use crate::outcome::StepFailure;
use crate::sinks::{SinkError, SinkStats};
use crate::source::{SourceError, SourceStats};
use crate::workflow::PoolError;

mod counts;
pub mod fds;
pub mod feed;
pub mod http;
pub mod live;
pub mod notify;
mod reload;
mod run;
mod shutdown;
mod supervise;
mod taps;

pub use counts::{FinalCounts, lines as count_lines};
pub use live::Live;
pub use notify::{Notifier, NotifyConfig, NotifySocket};
pub use run::run;

/// Run-time choices that are not part of the pipeline file.
#[derive(Debug, Default, Clone)]
pub struct RunOptions {
    /// Stop cleanly after this many frames.
    pub max_frames: Option<u64>,
    /// What the run shows while it runs; the caller may keep a clone to watch it.
    pub live: Arc<Live>,
    /// Where to tell systemd how the run is (`NotifyConfig::from_env`); the default sends
    /// nothing.
    pub notify: NotifyConfig,
}

/// Asks a running pipeline to stop (the first request drains, the second aborts) or to reload
/// its file.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: Sender<()>,
    rx: Receiver<()>,
    reload_tx: Sender<()>,
    reload_rx: Receiver<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (reload_tx, reload_rx) = crossbeam_channel::unbounded();
        Self {
            tx,
            rx,
            reload_tx,
            reload_rx,
        }
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for a stop; safe to call from a signal-handling thread.
    pub fn request(&self) {
        let _ = self.tx.send(());
    }

    /// Asks for the pipeline file to be read again and, if valid, swapped in (SIGHUP).
    pub fn reload(&self) {
        let _ = self.reload_tx.send(());
    }
}

/// What a run did. Invariant: `frames_decoded == frames_processed + frames_failed +
/// frames_dropped`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub frames_decoded: u64,
    pub frames_processed: u64,
    pub frames_failed: u64,
    pub frames_dropped: u64,
    pub sources: BTreeMap<String, SourceStats>,
    /// Per recorded source, its record stream's own counts (`decoded`: packets); not in the
    /// frame totals.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub record_streams: BTreeMap<String, SourceStats>,
    pub sinks: BTreeMap<String, SinkStats>,
    /// Per sink that writes the record stream as sent (`record`, `clip` in packets mode), per
    /// source: what it wrote, its gaps, and what a packets clip's ring dropped past its bounds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub recordings: BTreeMap<String, BTreeMap<String, crate::packets::RecordCounts>>,
    pub wall_seconds: f64,
    pub frames_per_second: f64,
    pub pool: PoolReport,
    /// Per source, the last value of every step that outputs counts (see `counts.rs`).
    pub counts: FinalCounts,
    /// Per sink, the files kept and purged; per filesystem, its free space.
    pub storage: crate::storage::StorageReport,
}

/// Pool activity: each dispatch queues one step; a wake-up is a worker leaving an idle wait.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolReport {
    pub workers: usize,
    /// Pools built for the run: 1 (the daemon's, or the one-shot executor's own), or 0 if a
    /// one-shot run never dispatched a step.
    pub pools_built: u64,
    pub dispatches: u64,
    /// Worker wake-ups from an idle wait.
    pub wakeups: u64,
    /// Wake-ups of the executor's coordinator (a frame in, a frame done, an abort).
    pub coordinator_wakeups: u64,
    /// Panics caught: in or around steps (each failed its frame) and in pool jobs.
    pub panics: u64,
}

/// Why a run failed; each maps to a sysexits code.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("sink \"{name}\": {source}")]
    Sink { name: String, source: SinkError },
    #[error("sink \"{name}\" lost {frames} frame(s) (failed writes or a full queue)")]
    SinkLost { name: String, frames: u64 },
    #[error("worker pool: {0}")]
    Pool(#[from] PoolError),
    #[error("step \"{}\" failed and on_step_error = \"stop\": {}", .0.step, .0.message)]
    StepStop(StepFailure),
    #[error("stop deadline of {timeout_s} s reached; abandoned: {abandoned}")]
    StopDeadline { timeout_s: u64, abandoned: String },
    #[error(transparent)]
    Http(#[from] http::HttpError),
}

impl DaemonError {
    /// sysexits: 69 unavailable source, 65 a file that could not be decoded whole, 73 cannot
    /// create output, 70 internal error.
    pub fn exit_code(&self) -> u8 {
        match self {
            // The input's fault, and everything decodable of it was processed: EX_DATAERR.
            Self::Source(SourceError::Incomplete { .. }) => 65,
            Self::Source(_) => 69,
            Self::Http(e) => e.exit_code(),
            Self::Sink {
                source: SinkError::Io { .. },
                ..
            } => 73,
            // A run that had to abandon something at the stop deadline lost frames or left a
            // thread or a file behind: not a clean end.
            // A sink that lost frames likewise: the exit code is 0 only if nothing was lost.
            Self::Sink { .. }
            | Self::SinkLost { .. }
            | Self::Pool(_)
            | Self::StepStop(_)
            | Self::StopDeadline { .. } => 70,
        }
    }
}

/// A failed run, with the report of what happened before it failed (if it started).
#[derive(Debug)]
pub struct Failure {
    pub report: Option<Box<Report>>,
    pub errors: Vec<DaemonError>,
}

impl Failure {
    pub(crate) fn before_start(error: DaemonError) -> Self {
        Self {
            report: None,
            errors: vec![error],
        }
    }

    /// The exit code of the first error.
    pub fn exit_code(&self) -> u8 {
        self.errors.first().map_or(70, DaemonError::exit_code)
    }
}
