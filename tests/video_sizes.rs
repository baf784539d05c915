//! Every frame size records, through the real binary and real encoders: a 641x481 camera (a
//! real MJPEG file of that size: x264 refuses odd 4:2:0 input, so the clip is made with
//! `jpegenc`), a `crop` to 101x75 or 3x3, a 17x17 test pattern. Each output is decoded with
//! GStreamer: it holds every frame, at the padded size, and the sink's `written` is that count.
//! `validate` says which sizes will be padded, and refuses one x264 cannot take.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{frames_and_sizes, read_json, run_to_eos, spawn_run, vidflow, write};

const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `pipeline` in `dir` to its end; its stats and stderr. The run must succeed.
fn run(dir: &Path, pipeline: &Path) -> (serde_json::Value, String) {
    let out = spawn_run(pipeline, &["--stats-json", "stats.json"], dir).finish(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    (read_json(&dir.join("stats.json")), out.stderr)
}

/// `vidflow validate PIPELINE` in `dir`: its exit code and stderr.
fn validate(dir: &Path, pipeline: &Path) -> (Option<i32>, String) {
    let out = vidflow()
        .arg("validate")
        .arg(pipeline)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), said)
}

#[test]
fn a_641x481_file_is_recorded_with_every_frame() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("odd.mkv");
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=90 ! \
         video/x-raw,format=I420,width=641,height=481,framerate=30/1 ! jpegenc ! matroskamux ! \
         filesink location={}",
        clip.display()
    ));
    assert_eq!(frames_and_sizes(&clip), (90, vec![(641, 481)]));
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{}\"\n\n[sinks.video]\nkind = \"video_file\"\n\
             path = \"out/{{source}}.mp4\"\nimage = \"$frame\"\n",
            clip.display()
        ),
    );
    let (stats, stderr) = run(dir.path(), &p);
    assert_eq!(stats["frames_decoded"], 90, "{stats}");
    assert_eq!(stats["sinks"]["video"]["written"], 90, "{stats}");
    assert_eq!(stats["sinks"]["video"]["dropped"], 0, "{stats}");
    let (frames, sizes) = frames_and_sizes(&dir.path().join("out/cam.mp4"));
    assert_eq!((frames, sizes), (90, vec![(642, 482)]));
    assert_eq!(
        stderr
            .matches("images of 641x481 are recorded padded to 642x482")
            .count(),
        1,
        "{stderr}"
    );
}

/// The line (1-based) of `text` that holds `what`.
fn line_of(text: &str, what: &str) -> usize {
    text.lines().position(|l| l.contains(what)).unwrap() + 1
}

#[test]
fn odd_and_tiny_sizes_record_every_frame_and_written_is_what_the_files_hold() {
    let dir = tempfile::tempdir().unwrap();
    // Three sinks of one run: a crop to 101x75, one to 3x3 and a resize to 17x17, in MP4
    // (which takes nothing under 16x16) and Matroska; one-second segments, so each sink
    // finishes several. Not live: a live test:// source drops frames when a loaded machine
    // falls behind (8 of 75 seen), and every frame must reach the sinks.
    let text = r#"
[sources.cam]
uri = "test://ball?width=320&height=240&fps=30&frames=75&live=false"

[steps.roi]
kind = "crop"
image = "$frame"
width = 101
height = 75

[steps.dot]
kind = "crop"
image = "$frame"
x = 5
y = 5
width = 3
height = 3

[steps.small]
kind = "resize"
image = "$frame"
width = 17
height = 17

[sinks.roi]
kind = "video_file"
path = "out/roi.mp4"
image = "$steps.roi.image"
segment_seconds = 1

[sinks.dot]
kind = "video_file"
path = "out/dot.mp4"
image = "$steps.dot.image"
segment_seconds = 1

[sinks.small]
kind = "video_file"
path = "out/small.mkv"
image = "$steps.small.image"
segment_seconds = 1

[sinks.whole]
kind = "video_file"
path = "out/whole.mkv"
image = "$frame"
segment_seconds = 1
"#;
    let p = write(dir.path(), "p.toml", text);
    let (code, said) = validate(dir.path(), &p);
    assert_eq!(code, Some(0), "{said}");
    for (sink, size) in [
        ("roi", "101x75 are recorded padded to 102x76"),
        ("dot", "3x3 are recorded padded to 16x16"),
        ("small", "17x17 are recorded padded to 18x18"),
    ] {
        let line = line_of(text, &format!("image = \"$steps.{sink}.image\""));
        let at = format!(
            "p.toml:{line}:9: note: sink \"{sink}\": \"$steps.{sink}.image\": images of {size}"
        );
        assert!(said.contains(&at), "{at}\n{said}");
    }
    assert_eq!(said.matches("note:").count(), 3, "{said}");

    let out = spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(DEADLINE);
    let (stats, stderr) = (read_json(&dir.path().join("stats.json")), out.stderr);
    assert_eq!(stats["frames_processed"], 75, "{stats}");
    for (sink, file, size) in [
        ("roi", "roi.mp4", (102, 76)),
        ("dot", "dot.mp4", (16, 16)),
        ("small", "small.mkv", (18, 18)),
        ("whole", "whole.mkv", (320, 240)),
    ] {
        let segments = common::segments(&dir.path().join("out").join(file));
        let decoded: Vec<_> = segments.iter().map(|s| frames_and_sizes(s)).collect();
        let frames: u64 = decoded.iter().map(|(n, _)| n).sum();
        // The stats say what the files hold, whatever they hold.
        assert_eq!(stats["sinks"][sink]["written"], frames, "{sink}: {stats}");
        assert_eq!(frames, 75, "{sink}: {segments:?}");
        assert!(segments.len() >= 2, "{sink}: {segments:?}");
        for (s, (_, sizes)) in segments.iter().zip(&decoded) {
            assert_eq!(sizes, &vec![size], "{}", s.display());
        }
        assert_eq!(stats["sinks"][sink]["dropped"], 0, "{sink}: {stats}");
    }
    for size in ["101x75", "3x3", "17x17"] {
        let said = format!("images of {size} are recorded padded");
        assert_eq!(stderr.matches(&said).count(), 1, "{size}: {stderr}");
    }
    assert!(!stderr.contains("images of 320x240"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn validate_refuses_a_crop_too_wide_for_h264() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        "[sources.cam]\nuri = \"test://ball\"\n\n[steps.strip]\nkind = \"crop\"\n\
         image = \"$frame\"\nwidth = 20000\nheight = 16\n\n[sinks.video]\nkind = \"video_file\"\n\
         path = \"out/v.mkv\"\nimage = \"$steps.strip.image\"\n",
    );
    let (code, said) = validate(dir.path(), &p);
    assert_eq!(code, Some(78), "{said}");
    assert!(
        said.contains("p.toml:13:9: sink \"video\": \"$steps.strip.image\": images of 20000x16 cannot be recorded"),
        "{said}"
    );
}
