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

use gstreamer as gst;

use crate::frame::{CameraClock, Frame};
use crate::packets::Packet;

/// How a clip's trigger was placed on its record stream (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timing {
    Timestamps,
    Rtcp,
    Arrival,
}

impl Timing {
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
}

impl Moment {
    pub(super) fn of(frame: &Frame, triggered: bool) -> Self {
        Self {
            captured: frame.captured,
            pts: frame.pts,
            clock: frame.clock.clone(),
            triggered,
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
/// its connection had a sender report (a timing never chosen then: [`on_camera_clock`]).
pub(super) fn packet_time(packet: &Packet, timing: Timing, decoding: bool) -> Duration {
    match timing {
        Timing::Timestamps => timestamp_of(&packet.buffer, decoding),
        Timing::Rtcp => packet.camera_time(decoding).unwrap_or_default(),
        Timing::Arrival => since_epoch(packet.arrival),
    }
}

/// Whether `packet`'s connection is on the camera's clock (it had a sender report).
pub(super) fn on_camera_clock(packet: &Packet) -> bool {
    packet.clock.as_ref().is_some_and(|c| c.known())
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

fn timestamp_of(buffer: &gst::BufferRef, decoding: bool) -> Duration {
    let t = if decoding {
        buffer.dts().or(buffer.pts())
    } else {
        buffer.pts().or(buffer.dts())
    };
    t.map(Duration::from).unwrap_or_default()
}
