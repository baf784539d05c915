//! GStreamer set-up shared by the source and the sinks that use GStreamer: initialized once per
//! process, with its debug log routed into vidflow's (see `log.rs`), and [`from_c`], the guard
//! for Rust code GStreamer calls from C.
//!
//! Rust code GStreamer calls from C runs inside an `extern "C"` function: a panic that reaches
//! its end aborts the whole process (Rust does not unwind into C). gstreamer-app's appsink and
//! appsrc callbacks and gstreamer's pad tasks catch a panic themselves (they post an error on
//! the bus); the log function, bus sync handlers, pad probes and signal handlers (`connect`)
//! do not, so the code vidflow gives them runs inside [`from_c`]: the log function, the
//! source's autoplug-select and appsink probes (`source/pipeline.rs`), and `video_file`'s
//! muxer probes, format-location and bus handler (`sinks/video_file/encoder.rs`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

mod log;

pub use log::TARGET as LOG_TARGET;

/// Initializes GStreamer once per process; every later call returns the first outcome.
pub fn init() -> Result<(), String> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // Before `gst::init`: GStreamer then never installs its own printer.
        log::route();
        gstreamer::init().map_err(|e| e.to_string())?;
        log::set_threshold();
        Ok(())
    })
    .clone()
}

/// Runs `f`, Rust code called from C (`what` names the callback): a panic in it is caught and
/// logged, and `fallback` returned in place of its result, so that it never aborts the daemon.
/// The panic's message went to stderr through the panic hook already; it is not repeated here.
pub fn from_c<R>(what: &'static str, fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        // Not through GStreamer's log: this may be its log function.
        tracing::error!(
            callback = what,
            "a panic in a callback from GStreamer was caught"
        );
        fallback
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What GStreamer calls: without the guard, the panic would reach the end of an `extern "C"`
    /// function and abort the test binary.
    extern "C" fn callback(panic: bool) -> i32 {
        from_c("test", -1, || {
            assert!(!panic, "a callback that panics");
            7
        })
    }

    #[test]
    fn a_panic_in_a_callback_from_c_is_caught_and_gives_the_fallback() {
        assert_eq!(callback(false), 7);
        assert_eq!(callback(true), -1);
    }
}
