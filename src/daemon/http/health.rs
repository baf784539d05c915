//! `/healthz`: healthy (200) while frames flow or a live source is retrying within its limit;
//! unhealthy (503, each reason on a line of the body) when:
//! - the run is draining (a stop was requested, or every source ended);
//! - a live source (a camera, a stream) has given no frame for longer than its limit,
//!   [`STALL_LIMIT_FACTOR`] times its `stall_timeout_ms`, counted from its last frame (or from
//!   its start if it never gave one): one `stall_timeout_ms` for the source to notice
//!   the stall and tear the connection down, one more for its reconnection to bring a frame
//!   back (a source that never gave one: from its start). A file or a test pattern has no such limit;
//! - a sink's last write failed;
//! - a recording sink (`record`, `clip` in packets mode) of a live source has written nothing
//!   of it (a packets clip: taken nothing into its ring) for longer than the source's limit
//!   plus the longest keyframe interval its stream has shown (after one lost packet nothing is
//!   written until the next keyframe, 10 to 30 s on a camera with a long or "smart" GOP): the
//!   record stream down, or giving nothing; or its last write failed (a full disk, a folder
//!   gone). It is healthy again once it writes.

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
    recordings(&parts, &mut reasons);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("\n") + "\n")
    }
}

/// The reasons a recording sink of this run is unhealthy (see the module header).
fn recordings(parts: &crate::daemon::live::Parts, reasons: &mut Vec<String>) {
    for row in crate::packets::hub().record_rows() {
        if !parts.sinks.iter().any(|s| s.name == row.sink) {
            continue;
        }
        let Some(source) = parts.sources.iter().find(|s| s.name == row.source) else {
            continue;
        };
        let (sink, name) = (&row.sink, &row.source);
        if row.stats.failing() {
            reasons.push(format!(
                "sink \"{sink}\": source \"{name}\": its last write failed"
            ));
            continue;
        }
        let Some(record) = source.record.as_ref().filter(|_| source.live) else {
            continue;
        };
        let limit = recording_limit(source.stall_timeout, &row.stats);
        let quiet = row.stats.quiet_for();
        if quiet > limit {
            reasons.push(format!(
                "sink \"{sink}\": nothing recorded of source \"{name}\" for {:.1} s (limit {:.1} s: {STALL_LIMIT_FACTOR} x stall_timeout_ms and the longest keyframe interval); its record stream is {}",
                quiet.as_secs_f64(),
                limit.as_secs_f64(),
                record.state().name()
            ));
        }
    }
}

/// How long a recording of a live source may write nothing before it is unhealthy: the
/// source's own limit, plus the longest time between two keyframes its stream has shown (see
/// the module header).
fn recording_limit(
    stall_timeout: std::time::Duration,
    stats: &crate::packets::RecordStats,
) -> std::time::Duration {
    use std::sync::atomic::Ordering;
    let gop = stats.keyframe_interval_max_ms.load(Ordering::Relaxed);
    stall_timeout * STALL_LIMIT_FACTOR + std::time::Duration::from_millis(gop)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;
    use crate::packets::RecordStats;

    #[test]
    fn a_recording_waiting_for_a_long_gops_next_keyframe_is_given_that_long() {
        let stats = RecordStats::default();
        let stall = Duration::from_secs(1);
        assert_eq!(recording_limit(stall, &stats), Duration::from_secs(2));
        // A camera whose keyframes came 4 s and then 20 s apart (a "smart" GOP on a still
        // scene): 20 s more, whatever the last interval was.
        stats
            .keyframe_interval_max_ms
            .fetch_max(20_000, Ordering::Relaxed);
        stats.keyframe_interval_ms.store(4_000, Ordering::Relaxed);
        assert_eq!(recording_limit(stall, &stats), Duration::from_secs(22));
    }
}
