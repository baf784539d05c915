//! A real decoded frame for tests: frame 40 of the animated `assets/Megamind.avi` (saturated
//! colours, sharp edges: the hard case for chroma), decoded by GStreamer and converted or scaled
//! to the caps a test asks for.

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

/// A pipeline of the tests from a gst-launch description whose appsink is named `sink`: both,
/// not started.
pub(crate) fn launch(description: &str) -> (gst::Pipeline, gst_app::AppSink) {
    gst::init().unwrap();
    let pipeline = gst::parse::launch(description)
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    (pipeline, sink)
}

/// Frame 40 of the clip, as `caps` (format and size) asked of videoconvert/videoscale.
pub(crate) fn decoded(caps: &str) -> (gst::Buffer, gst_video::VideoInfo) {
    gst::init().unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/Megamind.avi");
    let (pipeline, sink) = launch(&format!(
        "filesrc name=src ! decodebin ! videoconvert ! videoscale ! {caps} ! \
         appsink name=sink sync=false max-buffers=2"
    ));
    pipeline
        .by_name("src")
        .unwrap()
        .set_property("location", path);
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut sample = None;
    for _ in 0..=40 {
        sample = Some(
            sink.pull_sample()
                .expect("the clip has 41 frames (run scripts/fetch-assets)"),
        );
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let sample = sample.unwrap();
    let info = gst_video::VideoInfo::from_caps(sample.caps().unwrap()).unwrap();
    (sample.buffer_owned().unwrap(), info)
}
