//! The end of a run under the stop deadline: stopping the sources, counting what they leave,
//! joining the pool and closing the sinks, each waiting at most until its share of the deadline.
//!
//! The deadline is `[daemon] stop_timeout_s` after the first stop request (or after the run
//! ended by itself). The drain of frames gets it up to [`SINK_SHARE`] before its end, joining the
//! sources and the pool up to half that before, and the sinks the rest: a drain that does not
//! finish still leaves time to finalize the files. A thread still busy at its share's end is
//! abandoned (detached, never joined) and named in the log; frames not delivered by then are
//! counted as dropped. A second stop request cuts the drain and the joins short
//! ([`StopDeadline::aborted`]); the sinks keep their share.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::frame::Frame;
use crate::sinks::{SinkError, SinkRunner, SinkStats};
use crate::source::{SourceError, SourceHandle, SourceStats};
use crate::workflow::{FrameResult, Pool, PoolError};

/// The part of the stop deadline kept for closing the sinks (1/4): encoders finalize their
/// files in well under a second, and a drain that hangs must not take that time from them.
const SINK_SHARE: u32 = 4;

/// After a second stop request, how long frames in flight may take to finish before the drain
/// is given up: a step's frame usually takes milliseconds; "at once" waits for no more.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// When each stage of the shutdown must be over.
#[derive(Debug, Clone, Copy)]
pub(super) struct StopDeadline {
    /// The end of the whole shutdown.
    pub end: Instant,
    drain: Instant,
    joins: Instant,
}

impl StopDeadline {
    /// A shutdown that starts now.
    pub(super) fn starting_now(timeout: Duration) -> Self {
        let end = Instant::now() + timeout;
        Self {
            end,
            drain: end - timeout / SINK_SHARE,
            joins: end - timeout / (2 * SINK_SHARE),
        }
    }

    /// The same shutdown cut short by a second stop request: frames in flight get
    /// [`ABORT_GRACE`], sources and pool threads as long again, and the sinks, to finalize their
    /// files, what they would have had (their share), never past the first deadline.
    pub(super) fn aborted(&self) -> Self {
        let drain = self.drain.min(Instant::now() + ABORT_GRACE);
        let joins = self.joins.min(drain + ABORT_GRACE);
        let sinks = self.end.saturating_duration_since(self.drain);
        Self {
            end: self.end.min(joins + sinks),
            drain,
            joins,
        }
    }

    /// The drain of admitted frames ends here.
    pub(super) fn drain(&self) -> Instant {
        self.drain
    }

    /// Sources and pool threads are joined until here.
    pub(super) fn joins(&self) -> Instant {
        self.joins
    }

    /// The deadline itself: the sinks are closed, and the endpoint's threads stopped, by here.
    pub(super) fn end(&self) -> Instant {
        self.end
    }
}

/// Counts the results delivered to the sinks, and stops delivering once the drain is given up,
/// so that the counts read then are final. Written by the executor's thread; closed and read by
/// the daemon's (a mutex: counting and closing must not interleave).
#[derive(Debug, Default)]
pub(super) struct Delivered {
    state: Mutex<DeliveredState>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct DeliveredState {
    pub processed: u64,
    pub failed: u64,
    closed: bool,
}

impl Delivered {
    /// Counts a result; false if delivery is closed (the result is then not delivered).
    pub(super) fn count(&self, result: &FrameResult) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return false;
        }
        if result.failure().is_some() {
            state.failed += 1;
        } else {
            state.processed += 1;
        }
        true
    }

    /// Closes delivery; returns the final counts.
    pub(super) fn close(&self) -> DeliveredState {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        *state
    }
}

/// What the sources left: their counts, the frames still queued, their errors, and the names
/// of those that did not stop in time.
#[derive(Debug, Default)]
pub(super) struct SourcesStopped {
    pub stats: BTreeMap<String, SourceStats>,
    /// The record streams' counts, per recorded source.
    pub record: BTreeMap<String, SourceStats>,
    /// Frames taken out of the queues unprocessed.
    pub leftover: u64,
    pub errors: Vec<SourceError>,
    pub abandoned: Vec<String>,
}

/// Stops every source hard and waits for it until `deadline`. Frames still queued are taken
/// out and counted until a source's sender is gone (which also unblocks a streaming thread
/// waiting for room, so the source can stop).
pub(super) fn stop_sources(
    running: Vec<SourceHandle>,
    queues: Vec<Receiver<Frame>>,
    deadline: Instant,
) -> SourcesStopped {
    for source in &running {
        source.control().abort();
    }
    let mut out = SourcesStopped::default();
    for queue in &queues {
        // Until the source's sender is gone (disconnected) or the deadline.
        while queue.recv_deadline(deadline).is_ok() {
            out.leftover += 1;
        }
    }
    drop(queues);
    for source in running {
        let name = source.name().to_string();
        let counters = source.counters().clone();
        let record = source.record_counters().cloned();
        match source.join_until(deadline) {
            Some(Ok(())) => {}
            Some(Err(e)) => out.errors.push(e),
            None => {
                tracing::error!(source = %name, "source did not stop by the stop deadline; abandoned");
                out.abandoned.push(format!("source \"{name}\""));
            }
        }
        if let Some(record) = record {
            out.record.insert(name.clone(), record.snapshot());
        }
        out.stats.insert(name, counters.snapshot());
    }
    out
}

/// Shuts the pool down (joining its threads until `joins`), then closes every sink (until
/// `end`), even if the pool failed: the last two steps of the shutdown order.
pub(super) fn close_in_order(
    pool: Option<Pool>,
    sinks: Vec<SinkRunner>,
    deadline: &StopDeadline,
) -> (Result<(), PoolError>, Vec<SinkClosed>) {
    let pool = pool.map_or(Ok(()), |p| p.shutdown_until(deadline.joins()));
    // Workers abandoned in a step are named with the rest of what the stop left (`run/end.rs`).
    if let Err(e) = &pool
        && !matches!(e, PoolError::Abandoned(_))
    {
        tracing::error!(error = %e, "worker pool did not shut down cleanly; closing sinks anyway");
    }
    (pool, close_sinks(sinks, Some(deadline.end)))
}

/// A closed sink: its name, its counts, and how closing went (`None`: abandoned).
pub(super) type SinkClosed = (String, SinkStats, Option<Result<(), SinkError>>);

/// Closes every sink at once (each finalizes on its own thread), then waits for them until
/// `deadline`: a slow sink does not take the time of the others.
pub(super) fn close_sinks(sinks: Vec<SinkRunner>, deadline: Option<Instant>) -> Vec<SinkClosed> {
    let closing: Vec<_> = sinks.into_iter().map(SinkRunner::begin_close).collect();
    closing
        .into_iter()
        .map(|s| {
            let name = s.name().to_owned();
            match s.wait_until(deadline) {
                Some((stats, result)) => (name, stats, Some(result)),
                None => {
                    tracing::error!(sink = %name, "sink did not close by the stop deadline; abandoned");
                    (name, SinkStats::default(), None)
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_request_cuts_the_drain_and_joins_short_and_keeps_the_sinks_share() {
        let first = StopDeadline::starting_now(Duration::from_secs(20));
        let asked = Instant::now();
        let cut = first.aborted();
        assert!(cut.drain() <= asked + ABORT_GRACE + Duration::from_millis(50));
        assert!(cut.joins() <= cut.drain() + ABORT_GRACE);
        // The sinks' 5 s, from the joins on, within the first deadline.
        assert_eq!(cut.end - cut.joins(), Duration::from_secs(5));
        assert!(cut.end <= first.end);
        // Near the first deadline already: nothing is extended.
        let late = StopDeadline {
            end: asked + Duration::from_millis(500),
            drain: asked,
            joins: asked + Duration::from_millis(250),
        };
        let cut = late.aborted();
        assert_eq!(
            (cut.drain(), cut.joins(), cut.end),
            (late.drain, late.joins, late.end)
        );
    }
}
