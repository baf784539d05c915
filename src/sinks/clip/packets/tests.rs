//! A source's thread of a packets clip, driven by hand: real H.264 packets (x264 through
//! GStreamer), moments of the decoded stream as a file gives them, a real clip file.

use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::*;
use crate::storage::{Class, FilePolicy, Retention, Storage, StorageConfig, SystemClock};

/// `seconds` of a 64x64 file's H.264 at 10 fps, a keyframe a second, as its record stream
/// gives them (parsed access units with their timestamps).
fn file_packets(seconds: u32) -> Vec<Packet> {
    gst::init().unwrap();
    let pipeline = gst::parse::launch(&format!(
        "videotestsrc pattern=ball num-buffers={} ! \
         video/x-raw,format=I420,width=64,height=64,framerate=10/1 ! \
         x264enc speed-preset=ultrafast key-int-max=10 bframes=0 ! h264parse ! \
         video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false",
        seconds * 10
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut packets = Vec::new();
    // x264enc starts its timestamps at 1000 h; a file's start at zero.
    let mut base = None;
    while let Ok(sample) = sink.pull_sample() {
        let mut buffer = sample.buffer_owned().unwrap();
        let pts = buffer.pts().unwrap();
        let base = *base.get_or_insert(pts);
        let b = buffer.make_mut();
        b.set_pts(pts - base);
        b.set_dts(pts - base);
        packets.push(Packet {
            buffer,
            caps: sample.caps_owned().unwrap(),
            connection: 1,
            arrival: SystemTime::now(),
            clock: None,
            live: false,
        });
    }
    pipeline.set_state(gst::State::Null).unwrap();
    assert_eq!(packets.len(), seconds as usize * 10);
    packets
}

/// A source's thread's work for clips into `dir`, 0.5 s of pre-roll and post-roll.
fn work(storage: &Storage, dir: &std::path::Path) -> Work {
    let policy = FilePolicy {
        class: Class::Event,
        retention: Retention::default(),
        expected_file: 0,
    };
    let settings = Settings {
        dir: dir.to_owned(),
        pre_roll: Duration::from_millis(500),
        post_roll: Duration::from_millis(500),
        max_clip: Duration::from_secs(300),
        keyframe: Duration::from_secs(1),
        preset: "ultrafast".to_owned(),
        bitrate_kbps: 256,
    };
    // A file's packets (each packet's `live` says so too).
    let mut work = Work::new(settings, storage.sink("clips", policy));
    work.live = false;
    work
}

#[test]
fn a_decoded_stream_that_stops_during_a_clip_leaves_the_ring_bounded_and_the_clip_written() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work(&storage, dir.path());
    let mut on = Common::for_test("cam");
    let mut packets = file_packets(80).into_iter();
    for p in packets.by_ref().take(10) {
        work.packet(&mut on, p);
    }
    // A trigger at 0.5 s, then the decoded stream gives no more frame (a sub-stream that
    // stalls while the main stream goes on): 80 s of packets come.
    work.moment(&mut on, Moment::at(Duration::from_millis(500), true));
    assert!(work.clip.is_some(), "the clip opened");
    for p in packets {
        work.packet(&mut on, p);
    }
    assert_eq!(
        on.stats.segments.load(Ordering::Relaxed),
        1,
        "the clip, its post-roll written, is finished"
    );
    let timing = work.timing();
    let span = match (work.ring.front(), work.ring.back()) {
        (Some(a), Some(b)) => b.at(timing) - a.at(timing),
        _ => Duration::ZERO,
    };
    // A keyframe interval is the step the ring is cut by.
    assert!(
        span <= work.settings.pre_roll + RING_AHEAD + Duration::from_secs(1),
        "the ring reaches back {span:?}"
    );
    // Every packet is in the clip (0 to 1.0 s), still held, or dropped and counted.
    let written = on.stats.packets.load(Ordering::Relaxed);
    let dropped = on.stats.ring_dropped.load(Ordering::Relaxed);
    assert_eq!(written, 11);
    assert_eq!(written + work.ring.len() as u64 + dropped, 800);
    storage.stop();
}

#[test]
fn a_decoded_stream_that_gives_no_frame_leaves_the_ring_within_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work(&storage, dir.path());
    work.bounds.bytes = 16 << 10;
    let mut on = Common::for_test("cam");
    let mut most = 0;
    for p in file_packets(30) {
        work.packet(&mut on, p);
        most = most.max(work.ring_bytes);
    }
    assert!(most <= 16 << 10, "the ring held {most} bytes");
    assert!(on.stats.ring_dropped.load(Ordering::Relaxed) > 0);
    assert!(!work.ring.is_empty(), "the newest packets are kept");
    storage.stop();
}
