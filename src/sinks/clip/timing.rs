//! Where a trigger, a frame of the decoded stream, falls on the record stream, which is
//! another connection and maybe another stream of the camera (`packets.rs`). Three clocks:
//! - [`Timing::Timestamps`], a file: both streams read it, so a frame's timestamp is a
//!   packet's, exactly;
//! - [`Timing::Rtcp`], a live camera that sends RTCP sender reports on both connections: each
//!   frame and packet on the camera's own clock (`crate::frame::CameraClock`), which places
//!   the same instant of its two streams together whatever their delays;
//! - [`Timing::Arrival`], a live stream otherwise (until both connections had a report, or
//!   when only one has: two clocks cannot be compared): a packet's wall-clock arrival against
//!   the time the frame left its decoder.
//!
//! docs/guides/recording.md says what each costs. A clip keeps the timing it opened with; it
//! is its `timing` in `clips.jsonl`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::frame::{CameraClock, Frame};
use crate::packets::Packet;

/// Most by which the two streams' delays (each its camera time against its arrival) may differ
/// for their reports to be taken as one clock: a main-stream encoder that lags, jitter
/// buffers and networks stay far below it; beyond, the camera stamps its streams from two
/// clocks (or one report is wrong), and arrival time places the trigger instead.
const MOST_SKEW: Duration = Duration::from_secs(10);

/// How a clip's trigger was placed on its record stream (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timing {
    Timestamps,
    Rtcp,
    Arrival,
}

impl Timing {
    /// The timing for a record stream that is `live` or not, whose newest packet is `packet`,
    /// and a decoded stream whose latest trigger (or frame) is `moment`: a file's timestamps,
    /// the camera's clock once both are on it and agree within [`MOST_SKEW`], else arrival
    /// time.
    pub(super) fn choose(live: bool, moment: Option<&Moment>, packet: Option<&Packet>) -> Self {
        if !live {
            return Self::Timestamps;
        }
        match moment.zip(packet).and_then(|(m, p)| skew(m, p)) {
            Some(skew) if skew <= MOST_SKEW => Self::Rtcp,
            _ => Self::Arrival,
        }
    }

    /// Its name in `clips.jsonl`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Timestamps => "timestamps",
            Self::Rtcp => "rtcp",
            Self::Arrival => "arrival",
        }
    }
}

/// A frame of the decoded stream, as a source's thread needs it.
#[derive(Debug, Clone)]
pub(super) struct Moment {
    /// When the frame left its decoder.
    pub(super) captured: SystemTime,
    pts: Option<Duration>,
    clock: Option<Arc<CameraClock>>,
    pub(super) triggered: bool,
    /// Its frame number.
    pub(super) seq: u64,
}

impl Moment {
    pub(super) fn of(frame: &Frame, triggered: bool) -> Self {
        Self {
            captured: frame.captured,
            pts: frame.pts,
            clock: frame.clock.clone(),
            triggered,
            seq: frame.seq,
        }
    }

    /// A frame of a file at `pts`, for a test.
    #[cfg(test)]
    pub(super) fn at(pts: Duration, triggered: bool) -> Self {
        Self {
            captured: SystemTime::now(),
            pts: Some(pts),
            clock: None,
            triggered,
            seq: 0,
        }
    }

    /// A frame of a live camera at `pts` on the connection of `clock`, that left its decoder
    /// at `captured`, for a test.
    #[cfg(test)]
    pub(super) fn on_camera(
        captured: SystemTime,
        pts: Duration,
        clock: Arc<CameraClock>,
        triggered: bool,
        seq: u64,
    ) -> Self {
        Self {
            captured,
            pts: Some(pts),
            clock: Some(clock),
            triggered,
            seq,
        }
    }

    /// Its time by `timing`; `None` on the camera's clock before its connection had a sender
    /// report.
    pub(super) fn time(&self, timing: Timing) -> Option<Duration> {
        let wall = || since_epoch(self.captured);
        match timing {
            Timing::Timestamps => Some(self.pts.unwrap_or_else(wall)),
            Timing::Rtcp => self.clock.as_ref()?.time(self.pts?),
            Timing::Arrival => Some(wall()),
        }
    }
}

/// The time of `packet` by `timing`: its place in decoding order if `decoding` (what is cut at
/// the post-roll's end: every packet shown up to then is decoded before it), else when it is
/// shown (what is measured against the pre-roll's start). Zero on the camera's clock before
/// its connection had a sender report (a timing never chosen then: [`Timing::choose`]).
pub(super) fn packet_time(packet: &Packet, timing: Timing, decoding: bool) -> Duration {
    match timing {
        Timing::Timestamps => packet.timestamp(decoding).unwrap_or_default(),
        Timing::Rtcp => packet.camera_time(decoding).unwrap_or_default(),
        Timing::Arrival => since_epoch(packet.arrival),
    }
}

/// How far apart the two streams' delays are on the camera's clock: the frame's camera time
/// less the time it left its decoder, against the packet's camera time less its arrival.
/// `None` until both connections had a sender report.
fn skew(moment: &Moment, packet: &Packet) -> Option<Duration> {
    let ns = |d: Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX);
    let frame = ns(moment.time(Timing::Rtcp)?) - ns(since_epoch(moment.captured));
    let record = ns(packet.camera_time(false)?) - ns(since_epoch(packet.arrival));
    u64::try_from((frame - record).unsigned_abs())
        .ok()
        .map(Duration::from_nanos)
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use gstreamer as gst;

    use super::*;

    /// A packet of a live connection whose clock had a report or not.
    fn packet(reported: bool) -> Packet {
        packet_on(reported.then_some(1_000_000_000))
    }

    /// A packet of a live connection whose clock's report put PTS 0 at `camera_ns`, if any.
    fn packet_on(camera_ns: Option<i128>) -> Packet {
        gst::init().unwrap();
        let clock = CameraClock::new(Duration::ZERO);
        if let Some(camera_ns) = camera_ns {
            clock.report(camera_ns, 0);
        }
        let mut buffer = gst::Buffer::new();
        buffer
            .get_mut()
            .unwrap()
            .set_pts(gst::ClockTime::from_seconds(2));
        Packet {
            buffer,
            caps: gst::Caps::new_empty_simple("video/x-h264"),
            connection: 1,
            arrival: SystemTime::now(),
            clock: Some(Arc::new(clock)),
            live: true,
        }
    }

    /// A trigger on a live connection whose clock had a report or not.
    fn moment(reported: bool) -> Moment {
        let clock = CameraClock::new(Duration::ZERO);
        if reported {
            clock.report(1_000_000_000, 0);
        }
        Moment {
            captured: SystemTime::now(),
            pts: Some(Duration::from_secs(2)),
            clock: Some(Arc::new(clock)),
            triggered: true,
            seq: 0,
        }
    }

    #[test]
    fn the_cameras_clock_places_a_trigger_only_when_both_streams_are_on_it() {
        let choose = |m: bool, p: bool| Timing::choose(true, Some(&moment(m)), Some(&packet(p)));
        assert_eq!(choose(true, true), Timing::Rtcp);
        // One clock alone cannot be compared with arrival time: arrival for both.
        assert_eq!(choose(true, false), Timing::Arrival);
        assert_eq!(choose(false, true), Timing::Arrival);
        assert_eq!(choose(false, false), Timing::Arrival);
        assert_eq!(
            Timing::choose(true, None, Some(&packet(true))),
            Timing::Arrival
        );
        assert_eq!(
            Timing::choose(false, Some(&moment(true)), Some(&packet(true))),
            Timing::Timestamps
        );
        // Both on the camera's clock: 1 s + 2 s.
        let (m, p) = (moment(true), packet(true));
        assert_eq!(m.time(Timing::Rtcp), Some(Duration::from_secs(3)));
        assert_eq!(packet_time(&p, Timing::Rtcp, false), Duration::from_secs(3));
    }

    #[test]
    fn two_streams_whose_clocks_disagree_by_more_than_the_most_skew_are_placed_by_arrival() {
        // The frame and the packet arrived together, and each had a report: the record
        // stream's camera time 9 s after the frame's, then 11 s (a camera that stamps its two
        // streams from two clocks).
        let choose =
            |ns: i128| Timing::choose(true, Some(&moment(true)), Some(&packet_on(Some(ns))));
        assert_eq!(choose(1_000_000_000 + 9_000_000_000), Timing::Rtcp);
        assert_eq!(choose(1_000_000_000 + 11_000_000_000), Timing::Arrival);
    }
}
