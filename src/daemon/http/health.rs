//! `/healthz`: healthy (200) while frames flow or a live source is retrying within its limit;
//! unhealthy (503, each reason on a line of the body) when:
//! - the run is draining (a stop was requested, or every source ended);
//! - a live source (a camera, a stream) has given no frame for longer than its limit,
//!   [`STALL_LIMIT_FACTOR`] times its `stall_timeout_ms`, counted from its last frame (or from
//!   its start if it never gave one): one `stall_timeout_ms` for the source to notice
//!   the stall and tear the connection down, one more for its reconnection to bring a frame
//!   back (a source that never gave one: from its start). A file or a test pattern has no such limit;
//! - a sink's last write failed.

use crate::daemon::Live;
use crate::daemon::live::Phase;

/// A live source is unhealthy after this many `stall_timeout`s without a frame.
pub(super) const STALL_LIMIT_FACTOR: u32 = 2;

/// `Err` with the reasons, one per line, when unhealthy.
pub(super) fn check(live: &Live) -> Result<(), String> {
    let mut reasons = Vec::new();
    if live.phase() == Phase::Draining {
        reasons.push("draining: the pipeline is stopping".to_owned());
    }
    let parts = live.parts();
    for source in parts.sources.iter().filter(|s| s.live) {
        let limit = source.stall_timeout * STALL_LIMIT_FACTOR;
        // A source started by a reload is judged from its own start.
        let quiet = source.counters.quiet_for();
        if quiet > limit {
            reasons.push(format!(
                "source \"{}\": no frame for {:.1} s (limit {:.1} s: {STALL_LIMIT_FACTOR} x stall_timeout_ms), {}",
                source.name,
                quiet.as_secs_f64(),
                limit.as_secs_f64(),
                source.counters.state().name()
            ));
        }
    }
    for sink in parts.sinks.iter().filter(|s| s.sender.failing()) {
        reasons.push(format!("sink \"{}\": its last write failed", sink.name));
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("\n") + "\n")
    }
}
