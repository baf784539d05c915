//! Frame time: the time the event store gives a frame, for its rows' start and end and for the
//! rule that ends a track or a stretch of motion (unseen for some seconds of its source's own
//! time). Not the time its facts reached the writer: a frame that waited in a queue behind a
//! slow step, or a file read faster than real time, keeps the time of the scene.
//!
//! - A live camera's frame whose connection had an RTCP sender report: the camera's clock
//!   (`crate::frame::CameraClock`), when the camera's skew at its latest report (its clock
//!   minus this computer's) is within [`CAMERA_TRUST`]. A camera a few minutes off (no NTP)
//!   would move every event and per-minute count of it away from its recordings, snapshots
//!   and the other cameras; one whose clock was never set is years away (its rows deleted by
//!   retention at once).
//! - Else a frame with a timestamp: its timestamp placed on the wall clock by the first frame
//!   of its source (`captured - pts`), placed again after a reconnection or when the
//!   timestamps go back (a new connection, a file looping). So the events of a camera whose
//!   clock is not trusted follow this computer's clock, their arrival; the log says so once,
//!   and again if that changes.
//! - Else when it left its decoder.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::millis;

/// Farthest a camera's clock may be from this computer's (its skew, measured at each sender
/// report) for its frames to take their time from it. A camera synced by NTP is within tens
/// of milliseconds of UTC (a LAN server: a few ms), as this computer is; the measure also
/// takes off the report's way over the network, milliseconds on a LAN and well under a second
/// on any link a camera streams over. 2 s leaves room for both many times over, and for a
/// late report, so a synced camera never flips; a camera without NTP drifts about 1-2 s a day
/// (20 ppm quartz), so one set by hand leaves the bound within a day or two and one never set
/// is years off. Within it, the camera's clock is the better time (it is the capture's, not
/// its arrival after encoding, network and decoding); past it, its events would sit that far
/// from its recordings and the other cameras.
pub(super) const CAMERA_TRUST: Duration = Duration::from_secs(2);
/// The NTP epoch (1900) is this long before the Unix epoch (1970).
const NTP_TO_UNIX: Duration = Duration::from_secs(2_208_988_800);

/// What the writer needs of a frame to give it its time (see the module header).
#[derive(Debug, Clone, Copy)]
pub struct FrameTime {
    /// When it left its decoder.
    pub captured: SystemTime,
    /// Its timestamp, if its source gave one.
    pub pts: Option<Duration>,
    /// Its time on its camera's clock (since the Unix epoch), once its connection had a
    /// sender report.
    pub camera: Option<Duration>,
    /// The camera's clock minus this computer's (ns) at its connection's latest sender report.
    pub skew: Option<i64>,
    /// It is the first frame after its source reconnected.
    pub reconnected: bool,
}

impl FrameTime {
    /// The time of `frame`.
    pub fn of(frame: &crate::frame::Frame) -> Self {
        let camera = frame
            .clock
            .as_ref()
            .zip(frame.pts)
            .and_then(|(clock, pts)| clock.time(pts))
            .and_then(|ntp| ntp.checked_sub(NTP_TO_UNIX));
        Self {
            captured: frame.captured,
            pts: frame.pts,
            camera,
            skew: frame.clock.as_ref().and_then(|c| c.skew()),
            reconnected: frame.reconnected.is_some(),
        }
    }
}

/// Per source: where its timestamps sit on the wall clock, and its latest frame time.
#[derive(Debug, Default)]
pub(super) struct Clocks {
    sources: HashMap<Arc<str>, Placed>,
}

#[derive(Debug)]
struct Placed {
    /// Wall-clock ms of timestamp 0 (`captured - pts` of the frame it was placed by).
    base: i64,
    /// The time given to the source's last frame.
    last: i64,
    /// The latest time given to a frame of the source.
    latest: i64,
    /// Whether its camera's clock was trusted at its last frame that had one (what the log
    /// said last).
    trusted: Option<bool>,
}

impl Clocks {
    /// The time of a frame of `source` (ms since 1970), see the module header.
    pub(super) fn place(&mut self, source: &Arc<str>, t: &FrameTime) -> i64 {
        let captured = millis(t.captured);
        let pts = t
            .pts
            .map(|p| i64::try_from(p.as_millis()).unwrap_or(i64::MAX));
        let placed = self.sources.entry(source.clone()).or_insert(Placed {
            base: captured - pts.unwrap_or(0),
            last: i64::MIN,
            latest: i64::MIN,
            trusted: None,
        });
        let camera = t
            .camera
            .zip(t.skew)
            .filter(|&(_, skew)| placed.trust(source, skew))
            .map(|(c, _)| i64::try_from(c.as_millis()).unwrap_or(i64::MAX));
        let at = match (camera, pts) {
            (Some(camera), _) => camera,
            (None, Some(pts)) => {
                if t.reconnected || placed.base.saturating_add(pts) < placed.last {
                    placed.base = captured - pts;
                }
                placed.base.saturating_add(pts)
            }
            (None, None) => captured,
        };
        placed.last = at;
        placed.latest = placed.latest.max(at);
        at
    }

    /// The latest frame time of `source`, if a frame of it came.
    pub(super) fn now(&self, source: &str) -> Option<i64> {
        self.sources.get(source).map(|p| p.latest)
    }
}

impl Placed {
    /// Whether a camera `skew` ns off this computer's clock is trusted ([`CAMERA_TRUST`]);
    /// says so when that changes (a first trusted clock goes without saying).
    fn trust(&mut self, source: &str, skew: i64) -> bool {
        let trusted = u128::from(skew.unsigned_abs()) <= CAMERA_TRUST.as_nanos();
        if self.trusted != Some(trusted) {
            let skew_s = skew as f64 / 1e9;
            let bound_s = CAMERA_TRUST.as_secs_f64();
            if !trusted {
                tracing::warn!(
                    source,
                    skew_s,
                    bound_s,
                    "event store: the camera's clock is off this computer's by more than the bound: its events are placed by their arrival (this computer's clock) until it is back within (said once)"
                );
            } else if self.trusted.is_some() {
                tracing::info!(
                    source,
                    skew_s,
                    "event store: the camera's clock is within the bound again: its events take its time"
                );
            }
            self.trusted = Some(trusted);
        }
        trusted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(captured_ms: u64, pts_ms: Option<u64>) -> FrameTime {
        FrameTime {
            captured: SystemTime::UNIX_EPOCH + Duration::from_millis(captured_ms),
            pts: pts_ms.map(Duration::from_millis),
            camera: None,
            skew: None,
            reconnected: false,
        }
    }

    #[test]
    fn timestamps_place_frames_however_late_they_are_delivered() {
        let mut clocks = Clocks::default();
        let cam: Arc<str> = "cam".into();
        assert_eq!(clocks.place(&cam, &at(1_000_000, Some(0))), 1_000_000);
        // Left the decoder 10 s later (a slow step), 500 ms of the scene later.
        assert_eq!(clocks.place(&cam, &at(1_010_000, Some(500))), 1_000_500);
        assert_eq!(clocks.now("cam"), Some(1_000_500));
        // Timestamps that go back (a new connection) are placed again.
        assert_eq!(clocks.place(&cam, &at(1_020_000, Some(100))), 1_020_000);
        let mut back = at(1_030_000, Some(200));
        back.reconnected = true;
        assert_eq!(clocks.place(&cam, &back), 1_030_000);
        // No timestamp: when it left its decoder.
        assert_eq!(clocks.place(&"file".into(), &at(7, None)), 7);
    }

    /// A frame that left its decoder at `captured_ms` (this computer's clock) with timestamp
    /// `pts_ms`, at `camera_ms` on a camera whose clock was `skew_ms` off at its last report.
    fn on_camera(captured_ms: u64, pts_ms: u64, camera_ms: u64, skew_ms: i64) -> FrameTime {
        let mut t = at(captured_ms, Some(pts_ms));
        t.camera = Some(Duration::from_millis(camera_ms));
        t.skew = Some(skew_ms * 1_000_000);
        t
    }

    #[test]
    fn a_camera_clock_within_the_bound_is_the_time_of_its_frames() {
        let mut clocks = Clocks::default();
        let cam: Arc<str> = "cam".into();
        // NTP-synced, 40 ms behind; its frame left the decoder 700 ms after its capture.
        let t = on_camera(1_000_000_700, 0, 999_999_960, -40);
        assert_eq!(clocks.place(&cam, &t), 999_999_960);
        // Its skew at the bound is still trusted.
        let t = on_camera(1_000_001_700, 1000, 1_000_000_960, 2000);
        assert_eq!(clocks.place(&cam, &t), 1_000_000_960);
    }

    #[test]
    fn a_camera_clock_minutes_off_is_not_the_time_its_frames_arrived_are() {
        let mut clocks = Clocks::default();
        let cam: Arc<str> = "cam".into();
        // 3 minutes fast (no NTP): placed by arrival, the first frame's, its timestamps after.
        let fast = 180_000;
        let t = on_camera(1_000_000_000, 0, 1_000_000_000 + fast, fast as i64);
        assert_eq!(clocks.place(&cam, &t), 1_000_000_000);
        let t = on_camera(1_000_000_500, 400, 1_000_000_400 + fast, fast as i64);
        assert_eq!(clocks.place(&cam, &t), 1_000_000_400);
        // Just past the bound, slow: still arrival.
        let t = on_camera(1_000_001_000, 1000, 1_000_000_000 - 2001, -2001);
        assert_eq!(clocks.place(&cam, &t), 1_000_001_000);
        // Set right again (NTP came): its clock again.
        let t = on_camera(1_000_002_000, 2000, 1_000_001_990, -10);
        assert_eq!(clocks.place(&cam, &t), 1_000_001_990);
        // A camera whose clock was never set (1970): its timestamps.
        let other: Arc<str> = "other".into();
        let t = on_camera(1_000_000_000, 40, 5, -1_000_000_000);
        assert_eq!(clocks.place(&other, &t), 1_000_000_000);
    }
}
