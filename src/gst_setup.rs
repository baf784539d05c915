//! GStreamer set-up shared by the source and the sinks that use GStreamer.

use std::sync::OnceLock;

/// Initializes GStreamer once per process; every later call returns the first outcome.
pub fn init() -> Result<(), String> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| gstreamer::init().map_err(|e| e.to_string()))
        .clone()
}
