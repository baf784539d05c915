//! The supervisor of one source: connect, stream, and after a loss tear down and reconnect
//! with backoff. Each change of state is logged once; retries in between log at debug level,
//! with the delay chosen.
//!
//! Backoff: delays double from `initial_delay` per failed attempt. The loss of a stream that ran
//! for `reset_after` resets them and keeps the retries of that outage at `initial_delay` for
//! `reset_after` (see `flat_until`); a stream lost sooner keeps climbing (a flapping camera is not
//! hammered). A looping file starts its next pass at once, unless the pass gave no frame: then it
//! waits for the backoff too. A stop request ends the backoff wait at once (`wake`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::ended::Ended;
use super::options::Backoff;
use super::stream::Connection;
use super::{RUN, Shared, SourceError, SourceState, SourceUri};
use crate::frame::Frame;

pub(super) fn supervise(
    shared: &Arc<Shared>,
    frames: &Sender<Frame>,
    oldest: Option<&Receiver<Frame>>,
) -> Result<(), SourceError> {
    let live = shared.uri.is_live();
    // A camera or a stream that ends has gone away; a test pattern that ends was told to.
    let ends_for_good = !matches!(shared.uri, SourceUri::Rtsp { .. } | SourceUri::V4l2 { .. });
    let looping = shared.options.looping && matches!(shared.uri, SourceUri::File { .. });
    let mut retry = Retry::new(shared);
    loop {
        if shared.request() != RUN {
            return Ok(());
        }
        let started = Instant::now();
        let ended = attempt(shared, frames, oldest);
        let streamed = shared.last_frame_at().is_some_and(|t| t >= started);
        let stalled = matches!(ended, Ended::Stalled(_));
        let reason = match ended {
            Ended::Stopped => return Ok(()),
            Ended::Fatal(e) => return Err(last_error(shared, e)),
            // A pass that gave frames starts the next one at once; one that ended without a
            // frame (a file with no video frame) would rebuild the pipeline in a hot loop with
            // nothing to show for it: it waits for the backoff like a failed attempt.
            Ended::Eos if looping && streamed => {
                tracing::debug!(source = %shared.name, "end of file; looping");
                retry.backoff.reset();
                continue;
            }
            Ended::Eos if looping => "the file ended without a frame".to_owned(),
            Ended::Eos if ends_for_good => {
                tracing::info!(source = %shared.name, "end of stream");
                return shortfall(shared);
            }
            Ended::Failed(e) if !live => return Err(last_error(shared, e)),
            Ended::Eos => "the stream ended".to_owned(),
            Ended::Stalled(waiting) => waiting.reason(shared.options.stall_timeout),
            Ended::Failed(e) => e.to_string(),
        };
        shared.counters.set_last_error(&shared.uri, &reason);
        shared.counters.set_state(if stalled {
            SourceState::Stalled
        } else {
            SourceState::Retrying
        });
        retry.lost(shared, &reason, looping, streamed.then_some(started));
        if !retry.wait(shared, reason)? {
            return Ok(());
        }
    }
}

/// One connection: opened, watched until it ends, closed (bounded whatever the peer does:
/// `teardown.rs`); how it ended.
fn attempt(
    shared: &Arc<Shared>,
    frames: &Sender<Frame>,
    oldest: Option<&Receiver<Frame>>,
) -> Ended {
    match Connection::open(shared, frames, oldest) {
        Ok(mut connection) => {
            let ended = connection.watch(shared);
            let _ = connection.close(shared);
            // A stop ends the recording; it is no break in it (no gap).
            if let Some(topic) = &shared.packets
                && !matches!(ended, Ended::Stopped)
            {
                topic.lost();
            }
            ended
        }
        Err(ended) => ended,
    }
}

/// What the supervisor keeps between attempts: the backoff, whether a failure was reported
/// already (later ones log at debug level), and until when retries stay at `initial_delay`.
struct Retry {
    backoff: Backoff,
    reported: bool,
    /// Until when retries stay at `initial_delay`: for `reset_after` after the loss of a
    /// stream that had run that long. Doubling from the loss on, a retry that falls just
    /// before the server is back doubles the wait past it; the stream then runs shorter than
    /// `reset_after` before the next outage, which then starts from the doubled delay, and so
    /// on: gaps of 3.7, 3.6, 7.8, 6.7, 16.6 s for outages of 3 s every 15 s (issue 7). A
    /// stream that ran that long earns quick retries; a flapping one (shorter runs) still
    /// climbs.
    flat_until: Option<Instant>,
}

impl Retry {
    fn new(shared: &Shared) -> Self {
        let seed = shared.epoch.elapsed().as_nanos() as u64 ^ shared.name.len() as u64;
        Self {
            backoff: Backoff::new(shared.options.reconnect, seed),
            reported: false,
            flat_until: None,
        }
    }

    /// Says (once, then at debug level) why the attempt ended; `streamed_since`: when the
    /// attempt that gave frames started.
    fn lost(
        &mut self,
        shared: &Shared,
        reason: &str,
        looping: bool,
        streamed_since: Option<Instant>,
    ) {
        if looping {
            if self.reported {
                tracing::debug!(source = %shared.name, reason = %reason, "a pass without a frame");
            } else {
                tracing::warn!(source = %shared.name, reason = %reason, "the file ends at once; looping after a backoff");
                self.reported = true;
            }
        } else if let Some(started) = streamed_since {
            let reset_after = shared.options.reconnect.reset_after;
            if started.elapsed() >= reset_after {
                self.backoff.reset();
                self.flat_until = Some(Instant::now() + reset_after);
            } else {
                self.flat_until = None;
            }
            tracing::warn!(source = %shared.name, reason = %reason, "source lost; reconnecting");
            self.reported = true;
            shared.reconnecting.store(true, Ordering::Release);
        } else if !self.reported {
            tracing::warn!(source = %shared.name, reason = %reason, "cannot connect; retrying");
            self.reported = true;
        } else {
            tracing::debug!(source = %shared.name, reason = %reason, attempt = self.backoff.attempts(), "retry failed");
        }
    }

    /// Waits for the next attempt's delay: `Ok(false)` when a stop request came meanwhile, an
    /// error when the attempts are spent.
    fn wait(&mut self, shared: &Shared, reason: String) -> Result<bool, SourceError> {
        if !self.backoff.may_retry() {
            return Err(SourceError::GaveUp {
                name: shared.name.to_string(),
                uri: shared.uri.to_string(),
                attempts: self.backoff.attempts(),
                last: reason,
            });
        }
        let delay = if self.flat_until.is_some_and(|t| Instant::now() < t) {
            self.backoff.next_flat_delay()
        } else {
            self.backoff.next_delay()
        };
        tracing::debug!(source = %shared.name, delay_ms = delay.as_millis() as u64, attempt = self.backoff.attempts(), "next attempt after backoff");
        // Sleeps, unless a stop or abort request wakes it.
        Ok(!(shared.wake.1.recv_timeout(delay).is_ok() && shared.request() != RUN))
    }
}

/// `e`, kept as the source's last error too (observers show it).
fn last_error(shared: &Shared, e: SourceError) -> SourceError {
    shared.counters.set_last_error(&shared.uri, &e.to_string());
    e
}

/// A file that ended having given fewer frames than it holds (its duration at its frame rate,
/// known from its first frame): the rest could not be decoded. A frame or two, or 1%, is
/// rounding (a duration a few milliseconds off); more is a damaged or truncated file.
fn shortfall(shared: &Shared) -> Result<(), SourceError> {
    if !matches!(shared.uri, SourceUri::File { .. }) || shared.options.looping {
        return Ok(());
    }
    let Some(expected) = shared.counters.total() else {
        return Ok(());
    };
    let decoded = shared.counters.decoded.load(Ordering::Relaxed);
    let missing = expected.saturating_sub(decoded);
    if missing <= (expected / 100).max(2) {
        return Ok(());
    }
    shared.counters.missing.store(missing, Ordering::Relaxed);
    Err(SourceError::Incomplete {
        name: shared.name.to_string(),
        uri: shared.uri.to_string(),
        decoded,
        expected,
    })
}
