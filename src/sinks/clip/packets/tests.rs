//! A source's thread of a packets clip, driven by hand: real H.264 packets (x264 through
//! GStreamer), moments of the decoded stream as a file gives them, a real clip file.

use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;

use super::*;
use crate::storage::{Class, FilePolicy, Retention, Storage, StorageConfig, SystemClock};

/// `seconds` of a 64x64 file's H.264 at 10 fps, a keyframe a second, as its record stream
/// gives them (parsed access units with their timestamps).
fn file_packets(seconds: u32) -> Vec<Packet> {
    encoded(seconds, "")
}

/// [`file_packets`] of a camera that sends a constant `mbit_s` (x264's CBR: each access unit
/// filled up with filler data, as a camera in CBR mode sends them).
fn cbr_packets(seconds: u32, mbit_s: u32) -> Vec<Packet> {
    encoded(
        seconds,
        &format!(
            "bitrate={} option-string=nal-hrd=cbr:filler=1",
            mbit_s * 1000
        ),
    )
}

/// [`file_packets`] with `x264` options added.
fn encoded(seconds: u32, x264: &str) -> Vec<Packet> {
    gst::init().unwrap();
    let (pipeline, sink) = crate::frame::test_video::launch(&format!(
        "videotestsrc pattern=ball num-buffers={} ! \
         video/x-raw,format=I420,width=64,height=64,framerate=10/1 ! \
         x264enc speed-preset=ultrafast key-int-max=10 bframes=0 {x264} ! h264parse ! \
         video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false",
        seconds * 10
    ));
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
    work_with(storage, dir, Duration::from_millis(500))
}

/// [`work`] with `pre_roll`.
fn work_with(storage: &Storage, dir: &std::path::Path, pre_roll: Duration) -> Work {
    let policy = FilePolicy {
        class: Class::Event,
        retention: Retention::default(),
        expected_file: 0,
    };
    let settings = Settings {
        dir: dir.to_owned(),
        pre_roll,
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
        span <= work.settings.pre_roll + bounds::RING_AHEAD + Duration::from_secs(1),
        "the ring reaches back {span:?}"
    );
    // Every packet is in the clip (0 to 1.0 s), still held, or dropped and counted.
    let written = on.stats.packets.load(Ordering::Relaxed);
    let dropped = on.stats.ring_dropped_duration.load(Ordering::Relaxed);
    assert_eq!(on.stats.ring_dropped_bytes.load(Ordering::Relaxed), 0);
    assert!(work.bounds.said.past[Bound::Duration as usize], "said once");
    assert_eq!(written, 11);
    assert_eq!(written + work.ring.len() as u64 + dropped, 800);
    storage.stop();
}

#[test]
fn a_decoded_stream_that_gives_no_frame_leaves_the_ring_within_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work(&storage, dir.path());
    work.bounds.limit(16 << 10, 16 << 10);
    let mut on = Common::for_test("cam");
    let mut most = 0;
    for p in file_packets(30) {
        work.packet(&mut on, p);
        most = most.max(work.ring_bytes);
    }
    assert!(most <= 16 << 10, "the ring held {most} bytes");
    assert!(on.stats.ring_dropped_bytes.load(Ordering::Relaxed) > 0);
    assert_eq!(on.stats.ring_dropped_duration.load(Ordering::Relaxed), 0);
    assert!(work.bounds.said.past[Bound::Bytes as usize], "said once");
    assert!(!work.ring.is_empty(), "the newest packets are kept");
    storage.stop();
}

/// The frames of a decoded stream in step with `packets` (one per packet, at its time), the
/// one at `trigger` triggered, each numbered by its tenth of a second.
fn in_step(work: &mut Work, on: &mut Common, packets: Vec<Packet>, trigger: Option<Duration>) {
    for p in packets {
        let at = p.timestamp(false).unwrap();
        work.packet(on, p);
        let mut m = Moment::at(at, Some(at) == trigger);
        m.seq = tenths(at);
        work.moment(on, m);
    }
}

fn tenths(at: Duration) -> u64 {
    (at.as_millis() / 100) as u64
}

#[test]
fn a_pre_roll_of_more_than_64_mib_of_the_cameras_stream_is_held_whole() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    // 70 s of an 8 Mbit/s camera: 70 MB, more than the 64 MiB the ring once held whatever
    // the pre-roll.
    let mut work = work_with(&storage, dir.path(), Duration::from_secs(70));
    let mut on = Common::for_test("cam");
    let trigger = Duration::from_secs(71);
    let mut packets = cbr_packets(72, 8);
    let after = packets.split_off(711);
    in_step(&mut work, &mut on, packets, Some(trigger));
    let clip = work.clip.as_ref().expect("the clip opened");
    assert_eq!(
        clip.start,
        Duration::from_secs(1),
        "the clip starts at the keyframe 70 s before its trigger"
    );
    in_step(&mut work, &mut on, after, None);
    work.end(&mut on);
    assert_eq!(on.stats.segments.load(Ordering::Relaxed), 1);
    let dropped = [
        &on.stats.ring_dropped_bytes,
        &on.stats.ring_dropped_duration,
    ];
    assert_eq!(dropped.map(|d| d.load(Ordering::Relaxed)), [0, 0]);
    assert!(!work.bounds.said.ceiling);
    storage.stop();
}

/// A camera's sub-stream (the decoded one) connects again while a clip of its main stream is
/// written on the camera's clock, and the new connection triggers, then drops before its first
/// sender report: its trigger can never be placed on the camera's clock. The sub-stream's next
/// connection is on it; the main stream runs on until the ring's bound finishes the clip. A
/// later event's clip is made for that event alone. (The sender reports are given by hand: a
/// connection that drops before its first one cannot be had on cue from a test server.)
#[test]
fn a_clip_finished_by_the_rings_bound_leaves_no_trigger_to_the_next_clip() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work(&storage, dir.path());
    work.live = true;
    let mut on = Common::for_test("cam");
    // The camera's clock: each connection's PTS 0 at 1000 s; the packets arrive at their
    // capture, the sub-stream's frames leave their decoder at theirs.
    let base = SystemTime::now();
    let reported = || {
        let clock = crate::frame::CameraClock::new(Duration::ZERO);
        clock.report(1_000_000_000_000, 0);
        Arc::new(clock)
    };
    let main = reported();
    let mut packets = file_packets(80).into_iter().map(|mut p| {
        let at = p.timestamp(false).unwrap();
        p.live = true;
        p.clock = Some(main.clone());
        p.arrival = base + at;
        p
    });
    let frame = |at: Duration, clock: &Arc<crate::frame::CameraClock>, triggered: bool| {
        Moment::on_camera(base + at, at, clock.clone(), triggered, tenths(at))
    };
    for p in packets.by_ref().take(10) {
        work.packet(&mut on, p);
    }
    let sub = reported();
    work.moment(&mut on, frame(Duration::from_millis(500), &sub, true));
    assert_eq!(
        work.clip.as_ref().map(|c| c.timing),
        Some(Timing::Rtcp),
        "the first clip opened on the camera's clock"
    );
    let unreported = Arc::new(crate::frame::CameraClock::new(Duration::ZERO));
    work.moment(
        &mut on,
        frame(Duration::from_millis(700), &unreported, true),
    );
    let sub = reported();
    for p in packets.by_ref().take(700) {
        let at = p.timestamp(false).unwrap();
        work.packet(&mut on, p);
        work.moment(&mut on, frame(at, &sub, false));
    }
    assert_eq!(
        on.stats.segments.load(Ordering::Relaxed),
        1,
        "the ring's bound finished the first clip"
    );
    // A later event.
    for p in packets {
        let at = p.timestamp(false).unwrap();
        work.packet(&mut on, p);
        work.moment(&mut on, frame(at, &sub, at == Duration::from_secs(79)));
    }
    work.end(&mut on);
    let mut made_for: Vec<_> = storage.files(None).iter().map(|f| f.made_for).collect();
    made_for.sort();
    assert_eq!(made_for, [Some((5, 5)), Some((790, 790))]);
    storage.stop();
}

/// The decoded stream stalls while a clip is written and the camera's stream runs on: the
/// ring's bound finishes the clip and drops what the stalled frames would have asked for. When
/// the decoded stream comes back, its event goes on; the clip its triggers open at last (the
/// ring's first keyframe) is made only for those whose video it holds.
#[test]
fn a_clip_opened_late_is_made_only_for_the_triggers_whose_video_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work(&storage, dir.path());
    let mut on = Common::for_test("cam");
    let mut packets = file_packets(80).into_iter();
    for p in packets.by_ref().take(10) {
        work.packet(&mut on, p);
    }
    let mut first = Moment::at(Duration::from_millis(500), true);
    first.seq = 5;
    work.moment(&mut on, first);
    for p in packets {
        work.packet(&mut on, p);
    }
    assert_eq!(on.stats.segments.load(Ordering::Relaxed), 1);
    // The stalled frames come: a trigger every tenth of a second from 2 s on, one event.
    let mut start = None;
    for seq in 6..300 {
        let mut m = Moment::at(Duration::from_millis(seq * 100), seq >= 20);
        m.seq = seq;
        work.moment(&mut on, m);
        if let Some(clip) = &work.clip {
            start.get_or_insert(clip.start);
        }
    }
    let start = start.expect("a clip opened");
    assert!(start > Duration::from_secs(10), "{start:?}");
    work.end(&mut on);
    let second = storage
        .files(None)
        .into_iter()
        .filter_map(|f| f.made_for)
        .find(|&(first, _)| first != 5)
        .expect("the second clip");
    // Its first trigger's post-roll reaches its first packet.
    let post_roll = work.settings.post_roll;
    assert!(
        Duration::from_millis(second.0 * 100) + post_roll >= start,
        "made for frame {} but starts at {start:?}",
        second.0
    );
    storage.stop();
}

/// A pre-roll longer than the ring's ceiling holds at the camera's bitrate (the ceiling
/// lowered to 4 MiB here, 4 s of an 8 Mbit/s camera, for 20 s of pre-roll): said, and the
/// clip starts late for the byte bound, counted under it.
#[test]
fn a_pre_roll_past_the_rings_ceiling_is_said_and_its_clip_starts_late_for_the_byte_bound() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let mut work = work_with(&storage, dir.path(), Duration::from_secs(20));
    work.bounds.limit(1 << 20, 4 << 20);
    let mut on = Common::for_test("cam");
    let mut packets = cbr_packets(26, 8);
    let after = packets.split_off(251);
    let mut most = 0;
    for p in packets {
        let at = p.timestamp(false).unwrap();
        work.packet(&mut on, p);
        most = most.max(work.ring_bytes);
        work.moment(&mut on, Moment::at(at, at == Duration::from_secs(25)));
    }
    let clip = work.clip.as_ref().expect("the clip opened");
    assert!(clip.start > Duration::from_secs(15), "{:?}", clip.start);
    assert!(most <= 4 << 20, "the ring held {most} bytes");
    assert!(work.bounds.said.ceiling && work.bounds.said.late);
    assert!(on.stats.ring_dropped_bytes.load(Ordering::Relaxed) > 0);
    assert_eq!(on.stats.ring_dropped_duration.load(Ordering::Relaxed), 0);
    assert_eq!(on.stats.ring_limit_bytes.load(Ordering::Relaxed), 4 << 20);
    assert_eq!(on.stats.ring_limit_ms.load(Ordering::Relaxed), 80_000);
    in_step(&mut work, &mut on, after, None);
    work.end(&mut on);
    storage.stop();
}
