//! The camera's clock from its RTCP sender reports, for one connection of an RTSP stream
//! ([`CameraClock`]): what places a trigger on the decoded stream and the record stream's
//! packets on one clock (docs/guides/recording.md, "Event clips and time").
//!
//! How, on GStreamer 1.22: rtspsrc's `add-reference-timestamp-meta` gives the sender's clock
//! only for RFC 7273 senders, which cameras are not. What it does give: its `new-manager`
//! signal the rtpbin, rtpbin's `new-jitterbuffer` each stream's rtpjitterbuffer, and that
//! one's `handle-sync` each sender report (rtpbin connects to it too, for lip-sync; a signal
//! takes several handlers), with the jitterbuffer's relation between RTP timestamps and the
//! PTS it gives its buffers (`base-rtptime`, `base-time`, `clock-rate`) and the report itself
//! (`sr-buffer`). The PTS of the report's RTP timestamp, against the report's NTP time, is the
//! clock's offset.
//!
//! Measured (`tests/clip.rs`'s camera server, sending each frame at its capture time): the PTS
//! the appsinks see after decodebin or parsebin is the jitterbuffer's (its `ts-offset` stays
//! 0 with one stream, and is added anyway): a frame's camera time was 1 to 3 ms before it
//! left the decoder, and the same frame of the two streams was 20 ms apart on the camera's
//! clock when its packets arrived 1.1 s apart.
//!
//! The report's 32-bit RTP timestamp is extended here, to the one nearest the jitterbuffer's
//! present, and not taken from the signal's `sr-ext-rtptime`: the jitterbuffer gives -1 there
//! for a report more than 1 s ahead of the newest packet, which is every report of a stream
//! whose packets leave the camera more than 1 s after their capture (a slow main-stream
//! encoder: the case this is for). The report is read by hand (RFC 3550 6.4.1, a fixed
//! layout): gstreamer-rtp 0.25 binds GStreamer's RTCP buffer API only as unsafe FFI, and the
//! buffer comes from rtpsession, which validated it.
//!
//! Each report also measures the camera's skew (its clock minus this computer's when the report
//! arrived), kept in the clock (what the event store trusts it by, `events/time.rs`) and the
//! source's counters (`/api/health`, `/metrics`).
//!
//! Only video streams are followed: a camera's audio has an RTP timeline and delays of its
//! own, so its offset is not the video's.
//!
//! Threads: the handler runs on the GStreamer thread that receives the connection's RTCP,
//! once per report (every few seconds); the frames' path pays only for reading the offset.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gstreamer as gst;
use gstreamer::prelude::*;

use super::SourceCounters;
use super::pipeline::SOURCE_ELEMENT;
use crate::frame::CameraClock;
use crate::gst_setup::from_c;

const NS: i128 = 1_000_000_000;
/// The NTP epoch (1900) is this long before the Unix epoch (1970).
const NTP_TO_UNIX: Duration = Duration::from_secs(2_208_988_800);
/// RTCP packet type of a sender report (RFC 3550 6.4.1).
const SENDER_REPORT: u8 = 200;

/// What a connection's reports go to: its clock, and its source's name and counters.
#[derive(Clone)]
pub(super) struct Follower {
    pub clock: Arc<CameraClock>,
    pub name: Arc<str>,
    pub counters: Arc<SourceCounters>,
}

/// Keeps `to`'s clock and skew from the sender reports of the video stream of `pipeline`'s
/// rtspsrc, logging the first with the camera's skew.
pub(super) fn follow(pipeline: &gst::Pipeline, to: Follower) {
    let Some(src) = pipeline.by_name(SOURCE_ELEMENT) else {
        return;
    };
    src.connect("new-manager", false, move |args| {
        from_c("rtspsrc's new-manager", None, || {
            let manager = args.get(1).and_then(|v| v.get::<gst::Element>().ok());
            if let Some(manager) = manager {
                follow_jitterbuffers(&manager, &to);
            }
            None
        })
    });
}

fn follow_jitterbuffers(manager: &gst::Element, to: &Follower) {
    let to = to.clone();
    manager.connect("new-jitterbuffer", false, move |args| {
        from_c("rtpbin's new-jitterbuffer", None, || {
            let jitterbuffer = args.get(1).and_then(|v| v.get::<gst::Element>().ok())?;
            let ssrc = args.get(3).and_then(|v| v.get::<u32>().ok());
            let to = to.clone();
            jitterbuffer.connect("handle-sync", false, move |args| {
                from_c("rtpjitterbuffer's handle-sync", None, || {
                    let jitterbuffer = args.first().and_then(|v| v.get::<gst::Element>().ok());
                    let sync = args.get(1).and_then(|v| v.get::<gst::Structure>().ok());
                    let point = jitterbuffer
                        .zip(sync)
                        .and_then(|(j, s)| sync_point(&j, &s, ssrc));
                    if let Some((camera, pts)) = point {
                        taken(&to, camera, pts);
                    }
                    None
                })
            });
            None
        })
    });
}

/// Takes a report (`camera` ns since the NTP epoch, at `pts`) into `to`, with its skew.
fn taken(to: &Follower, camera: i128, pts: i128) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        + NTP_TO_UNIX;
    let now = i128::try_from(now.as_nanos()).unwrap_or(i128::MAX);
    to.clock.measured(camera, now);
    let first = to.clock.report(camera, pts);
    if let Some(skew) = to.clock.skew() {
        to.counters.set_clock_skew(skew);
        if first {
            let skew_s = skew as f64 / 1e9;
            tracing::info!(source = %to.name, skew_s, "times from the camera's clock (its RTCP sender reports); skew_s: its clock minus this computer's");
        }
    }
}

/// The camera's time (ns since the NTP epoch) and the PTS (ns) of one instant, from a sender
/// report of the video stream whose SSRC is `ssrc`; `None` for another stream's or a report
/// that cannot be placed yet.
fn sync_point(
    jitterbuffer: &gst::Element,
    sync: &gst::StructureRef,
    ssrc: Option<u32>,
) -> Option<(i128, i128)> {
    if !is_video(jitterbuffer) {
        return None;
    }
    // u64::MAX: no packet came yet.
    let known = |field: &str| sync.get::<u64>(field).ok().filter(|&v| v != u64::MAX);
    let base_rtp = i128::from(known("base-rtptime")?);
    let base_time = i128::from(known("base-time")?);
    let rate = i128::from(sync.get::<u32>("clock-rate").ok().filter(|&r| r > 0)?);
    let buffer = sync.get::<gst::Buffer>("sr-buffer").ok()?;
    let report = SenderReport::parse(buffer.map_readable().ok()?.as_slice())?;
    if ssrc.is_some_and(|s| s != report.ssrc) {
        return None;
    }
    // The RTP timestamp the jitterbuffer would give about now, and the report's nearest it.
    let now = i128::from(jitterbuffer.current_running_time()?.nseconds());
    let present = base_rtp + (now - base_time) * rate / NS;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "RTP timestamps wrap at 32 bits: the difference modulo 2^32, signed"
    )]
    let ahead = report.rtp_time.wrapping_sub(present as u32) as i32;
    let rtp = present + i128::from(ahead);
    let ts_offset = if jitterbuffer.has_property_with_type("ts-offset", i64::static_type()) {
        i128::from(jitterbuffer.property::<i64>("ts-offset"))
    } else {
        0
    };
    let pts = base_time + (rtp - base_rtp) * NS / rate + ts_offset;
    Some((report.ntp_ns(), pts))
}

/// Whether the jitterbuffer carries a video stream (its RTP caps say `media=video`).
fn is_video(jitterbuffer: &gst::Element) -> bool {
    jitterbuffer
        .static_pad("sink")
        .and_then(|p| p.current_caps())
        .and_then(|c| {
            c.structure(0)
                .and_then(|s| s.get::<&str>("media").ok().map(|m| m == "video"))
        })
        .unwrap_or(false)
}

/// What vidflow reads of a sender report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SenderReport {
    ssrc: u32,
    /// NTP timestamp: seconds since 1900 in the high 32 bits, their fraction in the low.
    ntp: u64,
    rtp_time: u32,
}

impl SenderReport {
    /// The first sender report of a compound RTCP packet: each packet a 4-byte header (version
    /// 2, its type, its length in 32-bit words less one), a sender report's then its SSRC, NTP
    /// timestamp and RTP timestamp.
    fn parse(mut data: &[u8]) -> Option<Self> {
        let be32 =
            |d: &[u8], at: usize| Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?));
        while let Some(&[first, kind, high, low]) = data.get(..4) {
            let length = (usize::from(u16::from_be_bytes([high, low])) + 1) * 4;
            let packet = data.get(..length)?;
            if first >> 6 == 2 && kind == SENDER_REPORT {
                let ntp = (u64::from(be32(packet, 8)?) << 32) | u64::from(be32(packet, 12)?);
                return Some(Self {
                    ssrc: be32(packet, 4)?,
                    ntp,
                    rtp_time: be32(packet, 16)?,
                });
            }
            data = &data[length..];
        }
        None
    }

    /// The NTP timestamp in ns since 1900.
    fn ntp_ns(&self) -> i128 {
        let seconds = i128::from(self.ntp >> 32);
        let fraction = i128::from(self.ntp & 0xffff_ffff);
        seconds * NS + ((fraction * NS) >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver report (empty), then a sender report, as a compound packet.
    fn compound() -> Vec<u8> {
        let mut data = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
        data.extend([0x80, SENDER_REPORT, 0, 6]);
        data.extend(0x1234_5678u32.to_be_bytes());
        data.extend(3_900_000_000u32.to_be_bytes());
        data.extend(0x8000_0000u32.to_be_bytes());
        data.extend(90_000u32.to_be_bytes());
        data.extend([0; 8]);
        data
    }

    #[test]
    fn a_sender_report_is_found_in_a_compound_packet_and_its_ntp_time_read() {
        let report = SenderReport::parse(&compound()).unwrap();
        assert_eq!(report.ssrc, 0x1234_5678);
        assert_eq!(report.rtp_time, 90_000);
        assert_eq!(report.ntp_ns(), 3_900_000_000 * NS + NS / 2);
    }

    #[test]
    fn a_packet_without_a_sender_report_or_cut_short_gives_none() {
        let data = compound();
        assert_eq!(SenderReport::parse(&data[..8]), None);
        assert_eq!(SenderReport::parse(&data[..20]), None);
    }
}
