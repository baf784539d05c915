//! What the notify thread decides, apart from its clock and its socket: whether the run is
//! ready, whether it earned a watchdog ping, what `STATUS=` says, and whether systemd's
//! watchdog variables are meant for this process. Pure functions of what [`Live`] showed at one
//! tick, so that each rule is tested on its own.
//!
//! [`Live`]: crate::daemon::Live

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::NotifyError;
use crate::daemon::live::{LiveSource, Phase};
use crate::source::SourceState;

/// One source as the rules see it at one tick.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SourceView {
    pub(super) name: Arc<str>,
    /// A camera or a stream (it retries under its `reconnect` policy), or a paced test pattern.
    pub(super) live: bool,
    pub(super) state: SourceState,
    /// It gave at least one frame in this run.
    pub(super) has_frame: bool,
    /// Frames decoded so far (for frames per second).
    pub(super) decoded: u64,
}

impl SourceView {
    pub(super) fn of(source: &LiveSource) -> Self {
        let counters = &source.counters;
        let has_frame = counters.since_last_frame().is_some();
        let state = match counters.state() {
            // The streaming thread stores the frame's time, then the state (two relaxed
            // stores): read in between, a source with a frame still says connecting.
            SourceState::Connecting if has_frame => SourceState::Streaming,
            state => state,
        };
        Self {
            name: source.name.clone(),
            live: source.live,
            state,
            has_frame,
            decoded: counters.decoded.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A camera or a stream between attempts or in one that has given no frame yet: what it
    /// does not deliver is missing for a reason its reconnect policy deals with.
    fn retrying(&self) -> bool {
        self.live
            && matches!(
                self.state,
                SourceState::Connecting | SourceState::Retrying | SourceState::Stalled
            )
    }
}

/// Whether every source has settled, so that systemd may call the run started (`READY=1`): it
/// gave a frame, or it ended, or it is live and retrying after an attempt that failed (a camera
/// that cannot be reached yet is retried forever, or up to its `max_attempts`; readiness does not
/// wait for it). A live source still in its first attempt has not settled: that attempt ends
/// with a frame, an error, or a stall after `stall_timeout_ms`.
pub(super) fn ready(sources: &[SourceView]) -> bool {
    sources.iter().all(|s| {
        s.has_frame
            || s.state == SourceState::Ended
            || (s.live && matches!(s.state, SourceState::Retrying | SourceState::Stalled))
    })
}

/// Whether the run earned a `WATCHDOG=1`: frames completed the workflow since the last ping, or
/// no source is streaming and a live source is retrying within its policy (its frames are
/// missing because the camera is, not because the workflow is stuck). A source that streams
/// while no frame completes is a stuck workflow, even if another source is retrying: no ping.
pub(super) fn earned_ping(delivered_since_ping: bool, sources: &[SourceView]) -> bool {
    delivered_since_ping
        || (!sources.iter().any(|s| s.state == SourceState::Streaming)
            && sources.iter().any(SourceView::retrying))
}

/// The text of `STATUS=`: each source's state, and its frames per second while it streams
/// (once measured), e.g. `street streaming 9.9 fps; cam2 retrying`; prefixed by the phase
/// unless the run is simply running, e.g. `draining: street ended`.
pub(super) fn status(phase: Phase, sources: &[SourceView], fps: &[Option<f64>]) -> String {
    let mut out = String::new();
    if phase != Phase::Running {
        let _ = write!(out, "{}: ", phase.name());
    }
    for (i, s) in sources.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        let _ = write!(out, "{} {}", s.name, s.state.name());
        if let (SourceState::Streaming, Some(Some(fps))) = (s.state, fps.get(i)) {
            let _ = write!(out, " {fps:.1} fps");
        }
    }
    out
}

/// Frames per second of each source, measured between two samples (the `STATUS=` ticks).
#[derive(Debug, Default)]
pub(super) struct Rates {
    last: Option<(Instant, HashMap<Arc<str>, u64>)>,
}

impl Rates {
    /// Per source, in order: its rate since the previous sample, `None` at the first sample
    /// of a source (a reload may bring new ones) or if no time passed.
    pub(super) fn sample(&mut self, now: Instant, sources: &[SourceView]) -> Vec<Option<f64>> {
        let rates = sources
            .iter()
            .map(|s| {
                let (then, counts) = self.last.as_ref()?;
                let before = *counts.get(&s.name)?;
                let seconds = now.saturating_duration_since(*then).as_secs_f64();
                (seconds > 0.0).then(|| s.decoded.saturating_sub(before) as f64 / seconds)
            })
            .collect();
        let counts = sources
            .iter()
            .map(|s| (s.name.clone(), s.decoded))
            .collect();
        self.last = Some((now, counts));
        rates
    }
}

/// systemd's watchdog timeout, read as `sd_watchdog_enabled` reads it: `WATCHDOG_USEC`
/// (microseconds, more than 0), meant for this process only if `WATCHDOG_PID` is unset or is
/// `own_pid`. `Ok(None)`: no watchdog for this process.
pub(super) fn watchdog_timeout(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    let timeout = match usec.trim().parse::<u64>() {
        Ok(us) if us > 0 && us < u64::MAX => Duration::from_micros(us),
        _ => return Err(NotifyError::WatchdogUsec(usec.to_owned())),
    };
    match pid {
        None => Ok(Some(timeout)),
        Some(pid) => match pid.trim().parse::<u32>() {
            Ok(p) if p > 0 => Ok((p == own_pid).then_some(timeout)),
            _ => Err(NotifyError::WatchdogPid(pid.to_owned())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SourceState::{Connecting, Ended, Retrying, Stalled, Streaming};

    fn source(name: &str, live: bool, state: SourceState, has_frame: bool) -> SourceView {
        SourceView {
            name: name.into(),
            live,
            state,
            has_frame,
            decoded: u64::from(has_frame),
        }
    }

    #[test]
    fn ready_waits_for_a_first_frame_from_a_file() {
        assert!(!ready(&[source("clip", false, Connecting, false)]));
        assert!(ready(&[source("clip", false, Streaming, true)]));
        // A file that gave its frames and ended still counts.
        assert!(ready(&[source("clip", false, Ended, true)]));
    }

    #[test]
    fn ready_counts_a_camera_retrying_under_its_policy() {
        // Its first attempt is still under way: not yet.
        assert!(!ready(&[source("cam", true, Connecting, false)]));
        assert!(ready(&[source("cam", true, Retrying, false)]));
        assert!(ready(&[source("cam", true, Stalled, false)]));
        // Lost after it had streamed: retrying, as well.
        assert!(ready(&[source("cam", true, Retrying, true)]));
    }

    #[test]
    fn ready_waits_for_every_source() {
        let street = source("street", true, Streaming, true);
        let clip = source("clip", false, Connecting, false);
        assert!(!ready(&[street.clone(), clip]));
        let cam2 = source("cam2", true, Retrying, false);
        assert!(ready(&[street, cam2]));
    }

    #[test]
    fn a_file_that_is_not_delivering_is_not_retrying() {
        // A file, even one not giving a frame, has no reconnect policy to wait for.
        assert!(!ready(&[source("clip", false, Stalled, false)]));
        assert!(!earned_ping(
            false,
            &[source("clip", false, Connecting, false)]
        ));
    }

    #[test]
    fn frames_completing_the_workflow_earn_a_ping() {
        assert!(earned_ping(
            true,
            &[source("street", true, Streaming, true)]
        ));
        assert!(earned_ping(true, &[source("clip", false, Ended, true)]));
    }

    #[test]
    fn a_stuck_workflow_earns_no_ping() {
        assert!(!earned_ping(
            false,
            &[source("street", true, Streaming, true)]
        ));
        assert!(!earned_ping(
            false,
            &[source("clip", false, Streaming, true)]
        ));
        // A camera retrying does not cover for another source's frames not completing.
        assert!(!earned_ping(
            false,
            &[
                source("street", true, Streaming, true),
                source("cam2", true, Retrying, false)
            ]
        ));
    }

    #[test]
    fn a_camera_retrying_within_its_policy_earns_a_ping() {
        for state in [Connecting, Retrying, Stalled] {
            assert!(
                earned_ping(false, &[source("cam", true, state, false)]),
                "{state:?}"
            );
        }
        assert!(earned_ping(
            false,
            &[
                source("clip", false, Ended, true),
                source("cam", true, Retrying, true)
            ]
        ));
        // Every source ended: nothing is retrying.
        assert!(!earned_ping(false, &[source("cam", true, Ended, true)]));
    }

    #[test]
    fn status_names_each_source_with_its_state_and_rate() {
        let sources = [
            source("street", true, Streaming, true),
            source("cam2", true, Retrying, false),
        ];
        assert_eq!(
            status(Phase::Running, &sources, &[Some(9.94), None]),
            "street streaming 9.9 fps; cam2 retrying"
        );
        // Before the rate is measured, and a rate is only shown while streaming.
        assert_eq!(
            status(Phase::Running, &sources, &[None, Some(3.0)]),
            "street streaming; cam2 retrying"
        );
        assert_eq!(
            status(Phase::Draining, &[source("street", true, Ended, true)], &[]),
            "draining: street ended"
        );
    }

    #[test]
    fn rates_are_frames_between_two_samples_over_the_time_between_them() {
        let mut rates = Rates::default();
        let t0 = Instant::now();
        let mut street = source("street", true, Streaming, true);
        street.decoded = 100;
        assert_eq!(rates.sample(t0, &[street.clone()]), [None]);
        street.decoded = 120;
        let cam2 = source("cam2", true, Streaming, true);
        let later = rates.sample(t0 + Duration::from_secs(2), &[street, cam2]);
        assert_eq!(later, [Some(10.0), None]);
    }

    #[test]
    fn the_watchdog_is_read_as_sd_watchdog_enabled_reads_it() {
        let second = Some(Duration::from_secs(1));
        assert_eq!(watchdog_timeout(None, None, 42).unwrap(), None);
        assert_eq!(watchdog_timeout(Some("1000000"), None, 42).unwrap(), second);
        assert_eq!(
            watchdog_timeout(Some("1000000"), Some("42"), 42).unwrap(),
            second
        );
        // Meant for another process (a parent that passed its environment on).
        assert_eq!(
            watchdog_timeout(Some("1000000"), Some("7"), 42).unwrap(),
            None
        );
        // A WATCHDOG_PID without WATCHDOG_USEC: no watchdog at all.
        assert_eq!(watchdog_timeout(None, Some("42"), 42).unwrap(), None);
        for bad in ["0", "", "-5", "1s", "18446744073709551615"] {
            let e = watchdog_timeout(Some(bad), None, 42).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("WATCHDOG_USEC \"{bad}\": not a positive number of microseconds")
            );
        }
        for bad in ["0", "x", "-1"] {
            let e = watchdog_timeout(Some("1000000"), Some(bad), 42).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("WATCHDOG_PID \"{bad}\": not a process id")
            );
        }
    }
}
