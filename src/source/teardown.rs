//! Taking one connection's pipeline down, in bounded time whatever its peer does.
//!
//! Threads: the pipeline is set to NULL on a `vidflow-teardown` thread while the supervisor
//! waits for it on a channel (capacity 1, one message: done). A healthy pipeline is down in
//! milliseconds (rtspsrc waits at most 100 ms for its TEARDOWN answer). One still going after
//! [`CUT_AFTER`] is held by a peer (see `cut.rs`): an RTSP source's connection is cut, which
//! ends the read rtspsrc is stuck in, and the NULL state follows. One still going
//! [`LEAVE_AFTER`] after the start (a cut that found no sure socket, a driver that hangs) is left
//! behind: its frame sender is taken from its appsink first, so the source's queue still closes,
//! and the teardown thread is detached, to finish whenever it can. Each cut and each pipeline
//! left behind is counted (`cut`, `abandoned` in the source's stats) and logged.

use std::sync::atomic::Ordering;
use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::Shared;
use super::stream::Connection;

/// How long a teardown may take before its connection is cut: rtspsrc's own TEARDOWN wait is
/// 100 ms, and a file or camera pipeline stops in milliseconds; this leaves a loaded machine
/// ten times that.
const CUT_AFTER: Duration = Duration::from_secs(1);
/// How long after its start a teardown that is still going is left behind: well past a cut's
/// effect (milliseconds), and well inside the stop deadline.
const LEAVE_AFTER: Duration = Duration::from_secs(4);

/// How a teardown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Down {
    /// The pipeline reached NULL.
    Clean,
    /// The pipeline reached NULL once its connection was cut.
    Cut,
    /// The pipeline was left behind, still going down on a detached thread.
    LeftBehind,
}

impl Connection {
    /// Takes the pipeline down completely; the appsink callbacks (and their frame sender) go.
    pub(super) fn close(mut self, shared: &Shared) -> Down {
        *shared
            .bus
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        // Read before the state change: videorate resets its counters when it stops.
        if let Some(rate) = self.pipeline.by_name(super::pipeline::RATE) {
            // Its "drop" count misses what max-rate drops: count in minus out.
            let (frames_in, frames_out): (u64, u64) = (rate.property("in"), rate.property("out"));
            let dropped = frames_in.saturating_sub(frames_out);
            shared
                .counters
                .throttled
                .fetch_add(dropped, Ordering::Relaxed);
        }
        let (done_tx, done) = crossbeam_channel::bounded::<()>(1);
        let pipeline = self.pipeline.clone();
        let eos_thread = self.eos_thread.take();
        let spawned = std::thread::Builder::new()
            .name("vidflow-teardown".to_owned())
            .spawn(move || {
                let _ = pipeline.set_state(gst::State::Null);
                if let Some(thread) = eos_thread {
                    // Returns once the pipeline is down, if it had not already.
                    let _ = thread.join();
                }
                let _ = done_tx.send(());
            });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                tracing::warn!(source = %shared.name, error = %e, "cannot spawn a teardown thread; tearing down here");
                let _ = self.pipeline.set_state(gst::State::Null);
                clear_callbacks(&self.appsink);
                return Down::Clean;
            }
        };
        let mut down = Down::Clean;
        if done.recv_timeout(CUT_AFTER).is_err() {
            down = self.cut(shared);
            if done.recv_timeout(LEAVE_AFTER - CUT_AFTER).is_err() {
                // Takes the frame sender away, so the source's queue closes all the same.
                clear_callbacks(&self.appsink);
                shared.counters.abandoned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    source = %shared.name,
                    waited_ms = LEAVE_AFTER.as_millis() as u64,
                    "the pipeline did not stop; left behind on a thread of its own"
                );
                return Down::LeftBehind;
            }
        }
        let _ = thread.join();
        clear_callbacks(&self.appsink);
        down
    }

    /// Cuts the connection of a pipeline whose teardown is held (RTSP only).
    fn cut(&self, shared: &Shared) -> Down {
        let Some(opened) = self.opened.as_ref() else {
            return Down::Clean;
        };
        match opened.cut() {
            Ok(sockets) => {
                shared.counters.cut.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    source = %shared.name,
                    waited_ms = CUT_AFTER.as_millis() as u64,
                    sockets,
                    "the server held the connection's teardown; connection cut"
                );
                Down::Cut
            }
            Err(why) => {
                tracing::warn!(source = %shared.name, reason = %why, "the server holds the connection's teardown, and it cannot be cut");
                Down::Clean
            }
        }
    }
}

fn clear_callbacks(appsink: &gst_app::AppSink) {
    appsink.set_callbacks(gst_app::AppSinkCallbacks::builder().build());
}
