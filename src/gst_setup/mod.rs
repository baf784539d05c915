//! GStreamer set-up shared by the source and the sinks that use GStreamer: initialized once per
//! process, with its debug log routed into vidflow's (see `log.rs`).

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
