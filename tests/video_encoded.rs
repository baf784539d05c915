//! Live video of sources with no H.264 of their own, through the real binary: a test pattern
//! (`test:`) and an MJPEG file (made here by GStreamer's `jpegenc ! avimux`) play from
//! `/api/video/NAME` as H.264 that vidflow encodes, which GStreamer demuxes and decodes, every
//! picture at the time written, each frame of the live feed (`/api/live`) on a picture of its
//! own time; the encoder runs only while someone watches, one for all of a source's viewers
//! (its metric, and the threads named `vidflow-encode`). The helpers are `video.rs`'s; nothing
//! is mocked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;
use crate::video::{DEADLINE, assert_frames_on_pictures, live_times, start, watch};

use common::mp4::{Fragment, TIMESCALE, decode};

use std::path::Path;

use http_client::{get, scrape, value, wait_until};

/// Makes an MJPEG AVI file of `frames` frames of a moving ball at 25 fps.
fn make_mjpeg_avi(path: &Path, frames: u32) {
    common::run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers={frames} ! \
         video/x-raw,width=320,height=240,framerate=25/1 ! jpegenc ! avimux ! \
         filesink location={}",
        path.display()
    ));
}

/// `/metrics`' `name` of `source` (0 when not there).
fn metric(port: u16, name: &str, source: &str) -> f64 {
    value(&scrape(port).unwrap(), name, &[("source", source)]).unwrap_or(0.0)
}

/// The threads of process `pid` named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// The source's `video` object in `/api/health`.
fn health_video(port: u16, source: &str) -> serde_json::Value {
    let (_, body) = get(port, "/api/health").unwrap();
    let h: serde_json::Value = serde_json::from_str(&body).unwrap();
    h["run"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == source)
        .unwrap()["video"]
        .clone()
}

#[test]
fn a_test_pattern_and_an_mjpeg_file_play_encoded_every_picture_at_its_frames_time() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.avi");
    make_mjpeg_avi(&clip, 50);
    let (run, port) = start(
        dir.path(),
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=320&height=240&fps=25\"\n\
             [sources.clip]\nuri = \"{}\"\nloop = true\n",
            clip.display()
        ),
    );
    // The pattern is live, at 25 fps: most of its frames are pictures of the video. The file is
    // read as fast as the pipeline takes it, many times its rate, and the encoder (below the
    // frame path's priority) drops what it has no room for: a few of its frames are pictures,
    // the others fall in the gaps, and none between two pictures.
    for (source, frames, least) in [("cam", 100, 25), ("clip", 400, 1)] {
        http_client::wait_for_frames(port, source, 10, DEADLINE);
        assert_eq!(health_video(port, source)["encoded"], true, "{source}");
        let mut mp4 = watch(port, source);
        let feed = std::thread::spawn(move || live_times(port, source, frames));
        // 4 s: a keyframe every 2 s, so at least one more than the first.
        let fragments: Vec<Fragment> = (0..100).map(|_| mp4.fragment()).collect();
        assert!(fragments[0].keyframe, "{source}: not from a keyframe");
        assert!(fragments.iter().skip(1).any(|f| f.keyframe), "{source}");
        assert!(
            fragments.windows(2).all(|w| w[1].decode > w[0].decode),
            "{source}: time goes back"
        );
        // GStreamer decodes every picture, at the time written.
        let mut written: Vec<u64> = fragments.iter().map(Fragment::presentation).collect();
        written.sort_unstable();
        assert_eq!(decode(&mp4.bytes, "h264"), written, "{source}");
        // Each live frame is on the picture of its own time (or in a gap the encoder skipped,
        // counted in vidflow_video_frames_dropped_total).
        assert_frames_on_pictures(&feed.join().unwrap(), &fragments, TIMESCALE / 25, least);
        assert!(metric(port, "vidflow_video_frames_encoded_total", source) >= 100.0);
        drop(mp4);
    }
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_sources_encoder_runs_only_while_it_is_watched_and_once_for_all_its_viewers() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        "[sources.cam]\nuri = \"test://ball?width=320&height=240&fps=25\"\n",
    );
    http_client::wait_for_frames(port, "cam", 25, DEADLINE);
    // Frames flow, nobody watches: no encoder.
    assert_eq!(metric(port, "vidflow_video_encoders", "cam"), 0.0);
    assert_eq!(
        metric(port, "vidflow_video_frames_encoded_total", "cam"),
        0.0
    );
    assert_eq!(threads_named(run.pid(), "vidflow-encode"), 0);

    let mut first = watch(port, "cam");
    let mut a = vec![first.fragment().decode];
    let mut second = watch(port, "cam");
    a.extend((0..50).map(|_| first.fragment().decode));
    let b: Vec<u64> = (0..25).map(|_| second.fragment().decode).collect();
    wait_until("two viewers counted", DEADLINE, || {
        (metric(port, "vidflow_video_viewers", "cam") == 2.0).then_some(())
    });
    // One encoder for both: the same pictures, at the same times.
    assert_eq!(metric(port, "vidflow_video_encoders", "cam"), 1.0);
    assert_eq!(health_video(port, "cam")["encoder"]["running"], 1);
    assert!(threads_named(run.pid(), "vidflow-encode") >= 1);
    assert!(
        b.iter().all(|t| a.contains(t)),
        "the second viewer's pictures {b:?} are not the first's {a:?}"
    );

    // Both gone: the encoder stops (after its grace period), its threads with it.
    drop((first, second));
    wait_until("the encoder stopped", DEADLINE, || {
        (metric(port, "vidflow_video_encoders", "cam") == 0.0).then_some(())
    });
    wait_until("its threads gone", DEADLINE, || {
        (threads_named(run.pid(), "vidflow-encode") == 0).then_some(())
    });
    let encoded = metric(port, "vidflow_video_frames_encoded_total", "cam");
    assert!(encoded >= 75.0, "{encoded}");
    // A new viewer starts it again, from a keyframe.
    let mut again = watch(port, "cam");
    assert!(again.fragment().keyframe);
    assert_eq!(metric(port, "vidflow_video_encoders", "cam"), 1.0);
    drop(again);
    run.terminate_cleanly(DEADLINE);
}
