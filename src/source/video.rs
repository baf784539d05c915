//! The decoded stream's packets for live viewers (`crate::packets::video`): a probe on the
//! input of the decoder that `decodebin` plugs takes each access unit the decoder is given,
//! with its timestamps moved as the frames' are (`pts_offset`, so a packet's time is its
//! frame's), and publishes it; the caps it sees say whether the stream is H.264 or H.265 (it
//! can go to a browser as it is; whether the browser plays it, the browser says) or why not.
//!
//! Why a probe on the decoder's input and not a second connection (the record stream): a camera
//! often allows few sessions, and these are the very packets the frames with their boxes come
//! from. A probe costs a reference to each buffer and a lock per packet, with or without
//! viewers (the source keeps the current group of pictures so a viewer starts at once); no
//! thread, no copy of the picture's bytes.
//!
//! A stream with no H.264 of its own (a test pattern, a raw camera, another codec) is
//! [`Status::Encodable`] or [`Status::Stills`], as the source's `live_video` says; while an
//! encoder runs for it, [`offer`] copies each decoded frame to it (`packets::video`'s tap).
//!
//! Runs on GStreamer's streaming thread of the decoded stream (the probe), on the thread that
//! plugs the decoder (`deep-element-added`) and on the frames' streaming thread ([`offer`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use gstreamer as gst;
use gstreamer::prelude::*;

use super::pipeline::DECODE;
use super::{LiveVideo, Shared, SourceUri};
use crate::frame::CameraClock;
use crate::packets::video::{Codec, Picture, Status, Video};
use crate::packets::{Packet, hub};

/// Watches the decoder `pipeline`'s `decodebin` plugs, for a new connection of `shared`'s
/// decoded stream.
pub(super) fn watch(
    pipeline: &gst::Pipeline,
    shared: &Arc<Shared>,
    clock: Option<Arc<CameraClock>>,
) {
    let video = hub().video(&shared.name);
    video.new_connection();
    if let SourceUri::Test(_) = shared.uri {
        // Its pictures are drawn here: never H.264 of its own.
        video.set_status(without_own_video(shared));
        return;
    }
    // Known again at this connection's caps; a source encoded or shown as stills stays so
    // meanwhile (a looping file connects again at each loop: its video goes on).
    if matches!(video.status(), Status::Not(_)) {
        video.set_status(Status::Waiting);
    }
    let Some(decode) = pipeline
        .by_name(DECODE)
        .and_then(|e| e.downcast::<gst::Bin>().ok())
    else {
        return;
    };
    let shared = shared.clone();
    let connection = crate::packets::new_connection();
    decode.connect_deep_element_added(move |_, _, element| {
        let is_video_decoder = element.factory().is_some_and(|f| {
            let klass = f.metadata(gst::ELEMENT_METADATA_KLASS).unwrap_or_default();
            klass.contains("Decoder") && klass.contains("Video")
        });
        if !is_video_decoder {
            return;
        }
        if let Some(pad) = element.static_pad("sink") {
            let (video, shared, clock) = (video.clone(), shared.clone(), clock.clone());
            pad.add_probe(
                gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_DOWNSTREAM,
                move |pad, info| {
                    crate::gst_setup::from_c(
                        "the decoder's input probe",
                        gst::PadProbeReturn::Ok,
                        || probe(pad, info, &video, &shared, connection, clock.as_ref()),
                    )
                },
            );
        }
    });
}

/// One buffer or event on the decoder's input.
fn probe(
    pad: &gst::Pad,
    info: &gst::PadProbeInfo,
    video: &Video,
    shared: &Shared,
    connection: u64,
    clock: Option<&Arc<CameraClock>>,
) -> gst::PadProbeReturn {
    match &info.data {
        Some(gst::PadProbeData::Event(event)) => {
            if let gst::EventView::Caps(caps) = event.view() {
                video.set_status(status_of(caps.caps(), shared));
            }
        }
        Some(gst::PadProbeData::Buffer(buffer)) => {
            let Some(caps) = pad.current_caps() else {
                return gst::PadProbeReturn::Ok;
            };
            let offset = gst::ClockTime::from_nseconds(shared.pts_offset.load(Ordering::Acquire));
            let mut buffer = buffer.clone();
            if offset > gst::ClockTime::ZERO {
                let b = buffer.make_mut();
                b.set_pts(b.pts().map(|t| t + offset));
                b.set_dts(b.dts().map(|t| t + offset));
            }
            video.publish(&Packet {
                buffer,
                caps,
                connection,
                arrival: SystemTime::now(),
                clock: clock.cloned(),
                live: shared.uri.is_live(),
            });
        }
        _ => {}
    }
    gst::PadProbeReturn::Ok
}

/// Whether a decoder's input of `caps` can go to a browser as it is; if not, what the
/// source's `live_video` chose (its H.264 or H.265 in pieces, not whole pictures, counts as none).
fn status_of(caps: &gst::CapsRef, shared: &Shared) -> Status {
    let Some(s) = caps.structure(0) else {
        return Status::Waiting;
    };
    let codec = match s.name().as_str() {
        "video/x-h264" => Codec::H264,
        "video/x-h265" => Codec::H265,
        _ => return without_own_video(shared),
    };
    // In pieces, not whole pictures: as if it had none.
    if s.get::<&str>("alignment").is_ok_and(|a| a != "au") {
        return without_own_video(shared);
    }
    Status::Playable(codec)
}

/// What a stream with no H.264 or H.265 of its own plays, as the source's `live_video` says.
fn without_own_video(shared: &Shared) -> Status {
    let x264 = gst::ElementFactory::find(ENCODER).is_some();
    chosen(shared.options.live_video, x264)
}

/// The GStreamer element that encodes a source's frames for its viewers
/// (`daemon::http::video::encoder`).
const ENCODER: &str = "x264enc";

/// What `live_video` makes of a stream with no H.264 or H.265 of its own, on a machine with the
/// encoder (`x264`) or without it (said, rather than a viewer waiting for pictures that never
/// come).
fn chosen(live_video: LiveVideo, x264: bool) -> Status {
    match live_video {
        LiveVideo::Encode if x264 => Status::Encodable,
        LiveVideo::Encode => Status::Not(format!(
            "its frames would be encoded, but GStreamer has no {ENCODER}: install \
             gstreamer1.0-plugins-ugly"
        )),
        LiveVideo::Stills => Status::Stills,
    }
}

/// At a connection's first frame: a stream whose decoder was never seen reaches vidflow
/// unencoded (a raw camera).
pub(super) fn first_frame(shared: &Shared) {
    let video = hub().video(&shared.name);
    if video.status() == Status::Waiting {
        video.set_status(without_own_video(shared));
    }
}

/// Copies a decoded frame (`buffer` of `caps`) for the source's encoder when one runs and has
/// room (see `packets::video`), its time moved as the frame's is (`pts_offset`), so that the
/// encoded picture's time is its frame's. A copy, not a reference: the encoder never holds
/// the decoder's buffers, which the frame path needs back.
pub(super) fn offer(
    video: &Video,
    shared: &Shared,
    buffer: &gst::Buffer,
    caps: &gst::Caps,
    clock: Option<&Arc<CameraClock>>,
) {
    video.offer_picture(|| {
        let mut copy = buffer.copy_deep().ok()?;
        let offset = gst::ClockTime::from_nseconds(shared.pts_offset.load(Ordering::Acquire));
        let b = copy.make_mut();
        b.set_pts(buffer.pts().map(|t| t + offset));
        b.set_dts(gst::ClockTime::NONE);
        Some(Picture {
            buffer: copy,
            caps: caps.clone(),
            arrival: SystemTime::now(),
            clock: clock.cloned(),
            live: shared.uri.is_live(),
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_the_encoder_says_so_instead_of_keeping_viewers_waiting() {
        assert_eq!(chosen(LiveVideo::Encode, true), Status::Encodable);
        assert_eq!(chosen(LiveVideo::Stills, true), Status::Stills);
        assert_eq!(chosen(LiveVideo::Stills, false), Status::Stills);
        let Status::Not(why) = chosen(LiveVideo::Encode, false) else {
            panic!("a source to encode on a machine without x264enc");
        };
        assert!(
            why.contains("x264enc") && why.contains("plugins-ugly"),
            "{why}"
        );
    }
}
