//! Frame time: the time the event store gives a frame, for its rows' start and end and for the
//! rule that ends a track or a stretch of motion (unseen for some seconds of its source's own
//! time). Not the time its facts reached the writer: a frame that waited in a queue behind a
//! slow step, or a file read faster than real time, keeps the time of the scene.
//!
//! - A live camera's frame whose connection had an RTCP sender report: the camera's clock
//!   (`crate::frame::CameraClock`), when it is within [`CAMERA_TRUST`] of the time the frame
//!   left its decoder (a camera whose clock was never set is years away: its rows would be
//!   deleted by retention at once).
//! - Else a frame with a timestamp: its timestamp placed on the wall clock by the first frame
//!   of its source (`captured - pts`), placed again after a reconnection or when the
//!   timestamps go back (a new connection, a file looping).
//! - Else when it left its decoder.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::millis;

/// Farthest a camera's clock may be from the time its frame left the decoder to be its time.
pub(super) const CAMERA_TRUST: Duration = Duration::from_secs(600);
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
}

impl Clocks {
    /// The time of a frame of `source` (ms since 1970), see the module header.
    pub(super) fn place(&mut self, source: &Arc<str>, t: &FrameTime) -> i64 {
        let captured = millis(t.captured);
        let pts = t
            .pts
            .map(|p| i64::try_from(p.as_millis()).unwrap_or(i64::MAX));
        let camera = t
            .camera
            .map(|c| i64::try_from(c.as_millis()).unwrap_or(i64::MAX))
            .filter(|c| c.abs_diff(captured) <= CAMERA_TRUST.as_millis() as u64);
        let placed = self.sources.entry(source.clone()).or_insert(Placed {
            base: captured - pts.unwrap_or(0),
            last: i64::MIN,
            latest: i64::MIN,
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(captured_ms: u64, pts_ms: Option<u64>) -> FrameTime {
        FrameTime {
            captured: SystemTime::UNIX_EPOCH + Duration::from_millis(captured_ms),
            pts: pts_ms.map(Duration::from_millis),
            camera: None,
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

    #[test]
    fn the_camera_clock_is_the_time_unless_it_is_far_off() {
        let mut clocks = Clocks::default();
        let cam: Arc<str> = "cam".into();
        let mut t = at(1_000_000_000, Some(0));
        t.camera = Some(Duration::from_millis(999_999_000));
        assert_eq!(clocks.place(&cam, &t), 999_999_000);
        // A camera whose clock was never set (1970): its timestamps instead.
        t.camera = Some(Duration::from_millis(5));
        t.pts = Some(Duration::from_millis(40));
        assert_eq!(clocks.place(&cam, &t), 1_000_000_040);
    }
}
