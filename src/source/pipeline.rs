//! Source URI -> GStreamer pipeline: the description, then the properties that carry the
//! location and credentials.
//!
//! Descriptions never contain a location: the element named `src` gets its `location` (a path,
//! or an RTSP URL without user and password) as a property after parsing, so a description can
//! be logged or shown safely, and no quoting of paths is needed. User and password go to
//! rtspsrc's `user-id` and `user-pw` alone.
//!
//! Memory: the appsink keeps one decoded frame (`max-buffers=1`), the callback hands over one
//! more, and the source's queue holds `queue` frames: `queue + 2` decoder buffers per source,
//! besides the decoder's own reference frames (fewer from a small fixed pool: past what it can
//! spare, frames are copies, `frame::Pins`). No conversion happens here for YUV: it would
//! convert frames no step needs in colour, and a full BGR conversion in the source
//! (videoconvert, even with 2 threads) was slower than vidflow converting in the pool in 5 of
//! the 6 clip runs of `scripts/bench-decode` (the other: 232 against 215 frames/s at 720p).

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use super::options::{Secret, SourceOptions, Transport};
use super::uri::{CameraFormat, SourceUri, TestPattern};
use crate::gst_setup::from_c;

/// Name of the element whose `location`/`device` property receives the URI.
pub(crate) const SOURCE_ELEMENT: &str = "src";
/// Name of the appsink that hands BGR frames to vidflow.
pub(crate) const APPSINK: &str = "frames";
/// Name of the videorate element that enforces `max_fps`.
pub(crate) const RATE: &str = "rate";
/// Name of the decodebin of a file, stream or camera.
pub(crate) const DECODE: &str = "decode";
/// Structure of the application message posted when frames are over `max_frame_pixels`
/// (fields `width` and `height`, u32), before anything decodes them.
pub(crate) const TOO_BIG: &str = "vidflow-frame-too-big";

/// After decoding: the `max_fps` throttle (dropping before any conversion), then whatever
/// conversion is needed to reach I420, NV12 or BGR (none for a decoder that gives I420 or
/// NV12: the BGR image is made later, only if a step asks for it), then the appsink.
fn tail(options: &SourceOptions, threads: usize) -> String {
    let rate = options
        .max_fps
        .map(|fps| format!("videorate name={RATE} drop-only=true max-rate={fps} ! "))
        .unwrap_or_default();
    format!(
        "{rate}videoconvert n-threads={threads} ! video/x-raw,format={{I420,NV12,BGR}} ! \
         appsink name={APPSINK} sync=false max-buffers=1 enable-last-sample=false"
    )
}

/// The gst-launch description for a source.
pub fn describe(uri: &SourceUri, options: &SourceOptions, convert_threads: usize) -> String {
    let tail = tail(options, convert_threads);
    match uri {
        SourceUri::File { .. } => {
            format!("filesrc name={SOURCE_ELEMENT} ! decodebin name={DECODE} ! {tail}")
        }
        SourceUri::Rtsp { .. } => {
            let protocols = match options.transport {
                Transport::Tcp => "tcp",
                Transport::Udp => "udp",
                Transport::Auto => "udp+tcp",
            };
            format!(
                "rtspsrc name={SOURCE_ELEMENT} latency={} protocols={protocols} ! decodebin name={DECODE} ! {tail}",
                options.latency_ms
            )
        }
        SourceUri::V4l2 {
            width,
            height,
            fps,
            format,
            ..
        } => {
            let mut caps = match format {
                Some(CameraFormat::Mjpg) => "image/jpeg".to_owned(),
                Some(CameraFormat::Raw) => "video/x-raw".to_owned(),
                None => String::new(),
            };
            let fields = [
                width.map(|w| format!("width={w}")),
                height.map(|h| format!("height={h}")),
                fps.map(|f| format!("framerate={f}/1")),
            ];
            for field in fields.into_iter().flatten() {
                if caps.is_empty() {
                    caps.push_str("video/x-raw");
                }
                caps.push(',');
                caps.push_str(&field);
            }
            let caps = if caps.is_empty() {
                String::new()
            } else {
                format!("{caps} ! ")
            };
            format!("v4l2src name={SOURCE_ELEMENT} ! {caps}decodebin name={DECODE} ! {tail}")
        }
        SourceUri::Test(t) => {
            let buffers = t
                .frames
                .map(|n| format!(" num-buffers={n}"))
                .unwrap_or_default();
            format!(
                "videotestsrc name={SOURCE_ELEMENT} pattern={} is-live={}{buffers} ! \
                 video/x-raw,width={},height={},framerate={}/1 ! {tail}",
                t.pattern, t.live, t.width, t.height, t.fps
            )
        }
    }
}

/// Encoded video a record stream takes, as whole access units: what `h264parse` and
/// `h265parse` give (and the muxers take) once they have parsed the stream.
const RECORD_CAPS: &str = "video/x-h264,alignment=au;video/x-h265,alignment=au";

/// The gst-launch description of a record stream: the camera's packets, depayloaded (RTSP)
/// or demuxed (a file) and parsed into access units, never decoded (`record.rs`).
pub(super) fn describe_record(uri: &SourceUri, options: &SourceOptions) -> Option<String> {
    let sink = format!(
        "parsebin ! capsfilter caps=\"{RECORD_CAPS}\" ! appsink name={APPSINK} sync=false \
         max-buffers=8 enable-last-sample=false"
    );
    match uri {
        SourceUri::File { .. } => Some(format!("filesrc name={SOURCE_ELEMENT} ! {sink}")),
        SourceUri::Rtsp { .. } => {
            let rtsp = describe(uri, options, 1);
            let head = rtsp.split(" ! ").next()?;
            Some(format!("{head} ! {sink}"))
        }
        SourceUri::V4l2 { .. } | SourceUri::Test(_) => None,
    }
}

/// Builds the pipeline of a source, with its location and credentials set as properties;
/// `packets`: its record stream's.
pub(crate) fn build(
    uri: &SourceUri,
    options: &SourceOptions,
    packets: bool,
) -> Result<(gst::Pipeline, gst_app::AppSink), String> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let description = if packets {
        describe_record(uri, options)
            .ok_or_else(|| format!("{uri}: only rtsp streams and files can be recorded"))?
    } else {
        describe(uri, options, threads)
    };
    let pipeline = gst::parse::launch(&description)
        .map_err(|e| e.to_string())?
        .downcast::<gst::Pipeline>()
        .map_err(|_| "description is not a pipeline".to_owned())?;
    if let Some(src) = pipeline.by_name(SOURCE_ELEMENT) {
        match uri {
            SourceUri::File { path } => {
                src.set_property("location", path.to_string_lossy().as_ref());
            }
            SourceUri::Rtsp { address } => {
                // The password never goes into the location, which GStreamer quotes in its
                // messages: rtspsrc takes user and password apart, decoded (its own URL parser
                // would refuse a user without a password, and decode nothing).
                src.set_property("location", address.without_credentials().as_str());
                // A read of the server that waits longer than the stall timeout fails, so that
                // a server gone quiet mid-answer cannot hold rtspsrc's task (and its teardown)
                // for its default 20 s. One that floods is cut instead (`teardown.rs`).
                let micros = u64::try_from(options.stall_timeout.as_micros()).unwrap_or(u64::MAX);
                src.set_property("tcp-timeout", micros.max(1));
                let (user, password) = match &options.credentials {
                    Some(c) => (c.user.as_str(), Some(c.password.expose())),
                    None => (address.user(), address.password().map(Secret::expose)),
                };
                if !user.is_empty() {
                    src.set_property("user-id", user);
                    src.set_property("user-pw", password.unwrap_or_default());
                }
            }
            SourceUri::V4l2 { device, .. } => {
                src.set_property("device", device.to_string_lossy().as_ref());
            }
            SourceUri::Test(_) => {}
        }
    }
    let appsink = pipeline
        .by_name(APPSINK)
        .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
        .ok_or_else(|| "no appsink in pipeline".to_owned())?;
    if let SourceUri::Test(TestPattern {
        pool: Some(buffers),
        ..
    }) = uri
    {
        fixed_pool(&appsink, *buffers)?;
    }
    limit_frame_size(&pipeline, &appsink, options.max_frame_pixels)?;
    Ok((pipeline, appsink))
}

/// The size in the caps of a stream, when they fix it, if over `max` pixels.
fn too_big(caps: &gst::CapsRef, max: u64) -> Option<(u32, u32)> {
    let s = caps.structure(0)?;
    let width = u32::try_from(s.get::<i32>("width").ok()?).ok()?;
    let height = u32::try_from(s.get::<i32>("height").ok()?).ok()?;
    (u64::from(width) * u64::from(height) > max).then_some((width, height))
}

/// Posts [`TOO_BIG`] with the size refused, from `element`.
fn refuse(element: &gst::Element, (width, height): (u32, u32)) {
    let structure = gst::Structure::builder(TOO_BIG)
        .field("width", width)
        .field("height", height)
        .build();
    let _ = element.post_message(gst::message::Application::new(structure));
}

/// Refuses frames over `max` pixels before they are decoded (a JPEG header may say 65535 x
/// 65535, and the decoder would allocate that): decodebin skips every decoder for a stream whose
/// parsed caps are too big, and the appsink drops caps that are (a raw camera or test pattern,
/// which no decoder makes). Either posts [`TOO_BIG`] on the bus first.
fn limit_frame_size(
    pipeline: &gst::Pipeline,
    appsink: &gst_app::AppSink,
    max: u64,
) -> Result<(), String> {
    if let Some(decode) = pipeline.by_name(DECODE) {
        // GstAutoplugSelectResult: 0 try, 2 skip (gst-plugins-base's gstplay-enum.h).
        let select = gst::glib::Type::from_name("GstAutoplugSelectResult")
            .filter(|t| gst::glib::EnumClass::with_type(*t).is_some())
            .ok_or_else(|| "decodebin's autoplug result type is unknown".to_owned())?;
        decode.connect("autoplug-select", false, move |args| {
            let result = from_c("decodebin's autoplug-select", 0, || {
                let caps = args.get(2).and_then(|v| v.get::<gst::Caps>().ok());
                match caps.as_deref().and_then(|c| too_big(c, max)) {
                    Some(size) => {
                        if let Some(bin) = args.first().and_then(|v| v.get::<gst::Element>().ok()) {
                            refuse(&bin, size);
                        }
                        2
                    }
                    None => 0,
                }
            });
            gst::glib::EnumClass::with_type(select).and_then(|c| c.to_value(result))
        });
    }
    let pad = appsink
        .static_pad("sink")
        .ok_or_else(|| "appsink has no sink pad".to_owned())?;
    // The appsink is found from the pad at each event, not held: a probe holding its own
    // element keeps it alive (with the buffers and the pool it holds) after the pipeline goes.
    pad.add_probe(gst::PadProbeType::EVENT_DOWNSTREAM, move |pad, info| {
        from_c("the appsink's caps probe", gst::PadProbeReturn::Ok, || {
            caps_probe(pad, info, max)
        })
    })
    .ok_or_else(|| "cannot watch the appsink's caps".to_owned())?;
    Ok(())
}

/// Refuses caps over `max` pixels: the frame sink posts the error, and the event is dropped.
fn caps_probe(pad: &gst::Pad, info: &mut gst::PadProbeInfo, max: u64) -> gst::PadProbeReturn {
    let Some(gst::PadProbeData::Event(event)) = &info.data else {
        return gst::PadProbeReturn::Ok;
    };
    let gst::EventView::Caps(caps) = event.view() else {
        return gst::PadProbeReturn::Ok;
    };
    match too_big(caps.caps(), max) {
        Some(size) => {
            if let Some(sink) = pad.parent_element() {
                refuse(&sink, size);
            }
            gst::PadProbeReturn::Drop
        }
        None => gst::PadProbeReturn::Ok,
    }
}

/// `test://...?pool=N`: the appsink answers the allocation query with a pool of exactly
/// `buffers` buffers, so the test pattern is drawn into a fixed pool the way a camera driver's
/// or a hardware decoder's frames are, and the producer waits while all of them are held.
fn fixed_pool(appsink: &gst_app::AppSink, buffers: u32) -> Result<(), String> {
    let pad = appsink
        .static_pad("sink")
        .ok_or_else(|| "appsink has no sink pad".to_owned())?;
    pad.add_probe(gst::PadProbeType::QUERY_DOWNSTREAM, move |_, info| {
        from_c(
            "the appsink's allocation probe",
            gst::PadProbeReturn::Ok,
            || allocation_probe(info, buffers),
        )
    })
    .ok_or_else(|| "cannot watch the appsink's allocation query".to_owned())?;
    Ok(())
}

/// Answers an allocation query with a pool of exactly `buffers` buffers of the caps' size.
fn allocation_probe(info: &mut gst::PadProbeInfo, buffers: u32) -> gst::PadProbeReturn {
    let Some(gst::PadProbeData::Query(query)) = &mut info.data else {
        return gst::PadProbeReturn::Ok;
    };
    let gst::QueryViewMut::Allocation(allocation) = query.view_mut() else {
        return gst::PadProbeReturn::Ok;
    };
    let size = allocation
        .get()
        .0
        .and_then(|caps| gst_video::VideoInfo::from_caps(caps).ok())
        .and_then(|info| u32::try_from(info.size()).ok());
    let Some(size) = size else {
        return gst::PadProbeReturn::Ok;
    };
    allocation.add_allocation_pool(None::<&gst::BufferPool>, size, buffers, buffers);
    gst::PadProbeReturn::Handled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe_uri(uri: &str) -> String {
        describe(
            &SourceUri::parse(uri).unwrap(),
            &SourceOptions::default(),
            2,
        )
    }

    #[test]
    fn camera_with_mjpeg_caps_decodes_before_conversion() {
        assert_eq!(
            describe_uri("v4l2:///dev/video2?width=1280&height=720&fps=30&format=mjpg"),
            "v4l2src name=src ! image/jpeg,width=1280,height=720,framerate=30/1 ! decodebin name=decode ! \
             videoconvert n-threads=2 ! video/x-raw,format={I420,NV12,BGR} ! appsink name=frames sync=false \
             max-buffers=1 enable-last-sample=false"
        );
    }

    #[test]
    fn camera_without_caps_lets_gstreamer_negotiate() {
        assert!(
            describe_uri("v4l2:///dev/video0")
                .starts_with("v4l2src name=src ! decodebin name=decode ! videoconvert")
        );
        assert!(
            describe_uri("v4l2:///dev/video0?width=640")
                .starts_with("v4l2src name=src ! video/x-raw,width=640 ! ")
        );
    }

    #[test]
    fn rtsp_description_never_holds_the_url_and_follows_the_options() {
        let uri = SourceUri::parse("rtsp://u:secret@cam/stream").unwrap();
        let options = SourceOptions {
            transport: Transport::Auto,
            latency_ms: 50,
            max_fps: Some(5),
            ..SourceOptions::default()
        };
        let d = describe(&uri, &options, 2);
        assert!(d.starts_with(
            "rtspsrc name=src latency=50 protocols=udp+tcp ! decodebin name=decode ! "
        ));
        assert!(d.contains("videorate name=rate drop-only=true max-rate=5 ! videoconvert"));
        assert!(!d.contains("secret") && !d.contains("cam/stream"));
    }

    #[test]
    fn every_description_parses_in_gstreamer() {
        gst::init().unwrap();
        for uri in [
            "test://ball?frames=3&live=false",
            "/tmp/x.mp4",
            "rtsp://cam/x",
            "v4l2:///dev/video0?format=raw&width=320&height=240",
        ] {
            let options = SourceOptions {
                max_fps: Some(10),
                ..SourceOptions::default()
            };
            build(&SourceUri::parse(uri).unwrap(), &options, false)
                .unwrap_or_else(|e| panic!("{uri}: {e}"));
            if !uri.starts_with("test:") && !uri.starts_with("v4l2:") {
                build(&SourceUri::parse(uri).unwrap(), &options, true)
                    .unwrap_or_else(|e| panic!("{uri} recorded: {e}"));
            }
        }
    }

    #[test]
    fn rtspsrc_gets_the_password_apart_decoded_and_a_location_without_it() {
        gst::init().unwrap();
        let uri = SourceUri::parse("rtsp://ad%20min:p%23s%40s@127.0.0.1:9/cam?c=1").unwrap();
        let (pipeline, _) = build(&uri, &SourceOptions::default(), false).unwrap();
        let src = pipeline.by_name(SOURCE_ELEMENT).unwrap();
        assert_eq!(
            src.property::<String>("location"),
            "rtsp://127.0.0.1:9/cam?c=1"
        );
        assert_eq!(src.property::<String>("user-id"), "ad min");
        assert_eq!(src.property::<String>("user-pw"), "p#s@s");
    }
}
