//! A camera's own clock, as one connection to it knows it from the camera's RTCP sender
//! reports: what places that connection's frames and packets on the clock that the camera's
//! other streams share (docs/guides/recording.md, "Event clips and time").
//!
//! A sender report pairs a time of the camera's clock (NTP) with an RTP timestamp of the
//! stream; the receiver knows the local time (PTS) its buffers of that RTP timestamp get, so
//! `offset = camera time - PTS` places every buffer of the connection, also those that came
//! before the first report, since the offset is read when a time is asked for, not when the
//! buffer came. The source writes it (`source/rtcp.rs`), at each report.
//!
//! Each report also gives the camera's skew: its clock minus this computer's when the report
//! arrived (`SystemTime::now()`), so less the report's way over the network (milliseconds on a
//! LAN). What the event store trusts the camera's clock by (`events/time.rs`).
//!
//! Shared state: [`CameraClock::offset`] and [`CameraClock::skew`] are written by the GStreamer thread that receives the
//! connection's RTCP (one report every few seconds) and read by whoever holds a frame or
//! packet of that connection (relaxed: a lone value; a reader that misses the newest report
//! gets the one before, a few microseconds apart).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Offset stored before the first sender report.
const NO_REPORT: i64 = i64::MIN;

/// The camera's clock for one connection of a live stream.
#[derive(Debug)]
pub struct CameraClock {
    /// Camera time (ns since the NTP epoch) minus the PTS (ns, before `pts_base`), from the
    /// latest sender report; [`NO_REPORT`] before the first.
    offset: AtomicI64,
    /// Camera time minus this computer's (ns) at the latest sender report; [`NO_REPORT`]
    /// before the first.
    skew: AtomicI64,
    /// What the source added to this connection's PTS (frames stay in order across
    /// reconnections), taken out again before the offset applies.
    pts_base: Duration,
}

impl CameraClock {
    /// The clock of a new connection, whose buffers' PTS were raised by `pts_base`.
    pub fn new(pts_base: Duration) -> Self {
        Self {
            offset: AtomicI64::new(NO_REPORT),
            skew: AtomicI64::new(NO_REPORT),
            pts_base,
        }
    }

    /// Takes a sender report: `camera_ns` (since the NTP epoch) is the camera's time of the
    /// buffers whose PTS (before `pts_base`) is `pts_ns`. True for the connection's first.
    pub fn report(&self, camera_ns: i128, pts_ns: i128) -> bool {
        let offset = i64::try_from(camera_ns - pts_ns).unwrap_or(NO_REPORT);
        if offset == NO_REPORT {
            return false;
        }
        self.offset.swap(offset, Ordering::Relaxed) == NO_REPORT
    }

    /// Takes a sender report's skew: it says `camera_ns` (since the NTP epoch), and this
    /// computer's clock said `now_ns` when it arrived.
    pub fn measured(&self, camera_ns: i128, now_ns: i128) {
        let skew = i64::try_from(camera_ns - now_ns).unwrap_or(if camera_ns < now_ns {
            i64::MIN + 1
        } else {
            i64::MAX
        });
        self.skew.store(skew.max(NO_REPORT + 1), Ordering::Relaxed);
    }

    /// The camera's clock minus this computer's (ns), at the latest sender report.
    pub fn skew(&self) -> Option<i64> {
        Some(self.skew.load(Ordering::Relaxed)).filter(|&s| s != NO_REPORT)
    }

    /// Whether a sender report came on this connection.
    pub fn known(&self) -> bool {
        self.offset.load(Ordering::Relaxed) != NO_REPORT
    }

    /// The camera's time (since the NTP epoch) of a buffer with this PTS, once a sender
    /// report came.
    pub fn time(&self, pts: Duration) -> Option<Duration> {
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == NO_REPORT {
            return None;
        }
        let pts = i128::try_from(pts.saturating_sub(self.pts_base).as_nanos()).ok()?;
        let ns = u64::try_from(pts + i128::from(offset)).ok()?;
        Some(Duration::from_nanos(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_places_every_buffer_of_its_connection_also_the_earlier_ones() {
        let clock = CameraClock::new(Duration::from_secs(100));
        let before = Duration::from_secs(101);
        assert_eq!(clock.time(before), None);
        assert!(!clock.known());
        // The camera's 5000 s is this connection's PTS 3 s (103 s with its base), and it came
        // when this computer's clock said 5002.5 s.
        assert_eq!(clock.skew(), None);
        assert!(clock.report(5_000_000_000_000, 3_000_000_000));
        clock.measured(5_000_000_000_000, 5_002_500_000_000);
        assert!(clock.known());
        assert_eq!(clock.skew(), Some(-2_500_000_000));
        assert_eq!(clock.time(before), Some(Duration::from_secs(4998)));
        assert_eq!(
            clock.time(Duration::from_secs(104)),
            Some(Duration::from_secs(5001))
        );
        // A later report moves every buffer with it, and is not the first.
        assert!(!clock.report(5_000_000_000_010, 3_000_000_000));
        clock.measured(5_000_000_000_010, 5_000_000_000_000);
        assert_eq!(clock.skew(), Some(10));
        assert_eq!(
            clock.time(before),
            Some(Duration::from_nanos(4_998_000_000_010))
        );
    }
}
