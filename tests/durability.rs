//! What a power cut cannot take: every segment and clip vidflow finished is on the disk, with
//! the folder entry that names it. Watched on the real `vidflow` binary with `strace` (Debian's
//! strace, installed by scripts/install-deps), which prints each `fsync` with the path of its
//! file (`-y`): a finished file's data sits in the page cache until the kernel writes it back
//! (up to about 30 s), and nothing else here can tell a synced file from one that is not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_to_eos, segments, spawn_command, write};

/// A `video_file` sink of 1 s segments.
const VIDEO_SINK: &str = r#"
[sinks.video]
kind = "video_file"
path = "video/{source}.mkv"
image = "$frame"
segment_seconds = 1
preset = "ultrafast"
"#;

/// The files under `dir` ending in `ext`, by name.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    found.sort();
    found
}

/// The paths that [`traced`]'s `TRACE.PID` files show a successful `fsync` of.
fn synced(trace: &Path) -> Vec<PathBuf> {
    let name = trace.file_name().unwrap().to_string_lossy().into_owned();
    let text: String = std::fs::read_dir(trace.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&name))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    text.lines()
        .filter(|l| l.contains("fsync(") && l.trim_end().ends_with("= 0"))
        .filter_map(|l| {
            let start = l.find('<')? + 1;
            let end = l[start..].find('>')? + start;
            Some(PathBuf::from(&l[start..end]))
        })
        .collect()
}

/// `vidflow run PIPELINE` in `dir` under strace, which writes each `fsync` with its path
/// (`-y`) to `TRACE.PID`, one file per thread (`-ff`: no call split over two lines).
fn traced(dir: &Path, pipeline: &Path, trace: &Path) -> common::Running {
    let mut command = Command::new("strace");
    command
        .args([
            "-ff",
            "-qq",
            "-y",
            "-e",
            "trace=fsync",
            "-e",
            "signal=none",
            "-o",
        ])
        .arg(trace)
        .arg(common::vidflow().get_program())
        .arg("run")
        .arg(pipeline)
        .env("VIDFLOW_LOG", "info");
    spawn_command(dir, command)
}

#[test]
fn every_finished_segment_and_clip_is_synced_with_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    // Deal with the canonical path: strace names files by it.
    let root = dir.path().canonicalize().unwrap();
    let camera = root.join("camera.mp4");
    // 3 s at 30 fps, a keyframe every 15 frames: three 1 s segments, one clip.
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=90 ! \
         video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! \
         x264enc speed-preset=ultrafast key-int-max=15 ! h264parse ! mp4mux ! \
         filesink location={}",
        camera.display()
    ));
    let camera_uri = camera.to_string_lossy();
    let sinks = VIDEO_SINK.to_owned()
        + r#"
[sinks.rec]
kind = "record"
path = "rec/{source}.mp4"
segment_seconds = 1

[sinks.clips]
kind = "clip"
mode = "packets"
dir = "clips"
when = ["$steps.motion.detections"]
pre_roll_s = 0.5
post_roll_s = 0.5
"#;
    let text = common::motion_pipeline(&[("cam", &camera_uri)], &sinks);
    let pipeline = write(&root, "p.toml", &text);
    let trace = root.join("trace");
    let out = traced(&root, &pipeline, &trace).finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);

    let synced = synced(&trace);
    let recorded = segments(&root.join("rec/cam.mp4"));
    let encoded = segments(&root.join("video/cam.mkv"));
    let clips = files(&root.join("clips"), "mp4");
    assert!(recorded.len() >= 2, "{recorded:?}\n{}", out.stderr);
    assert!(encoded.len() >= 2, "{encoded:?}\n{}", out.stderr);
    assert!(!clips.is_empty(), "no clip\n{}", out.stderr);
    for file in recorded.iter().chain(&encoded).chain(&clips) {
        assert!(
            synced.contains(file),
            "{} was finished but never synced; synced: {synced:#?}",
            file.display()
        );
        let folder = file.parent().unwrap().to_owned();
        assert!(
            synced.contains(&folder),
            "the folder {} was never synced; synced: {synced:#?}",
            folder.display()
        );
    }
}

#[test]
fn a_segment_is_synced_while_the_run_goes_on_not_only_at_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let pipeline = write(
        &root,
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=320&height=240&fps=30&live=true\"\n\
             {VIDEO_SINK}"
        ),
    );
    let trace = root.join("trace");
    let running = traced(&root, &pipeline, &trace);
    // The third segment begins: the first two are finished.
    running.wait_for_stderr_times("new video segment", 3, Duration::from_secs(60));
    let first = root.join("video/cam.mkv");
    // strace writes each call as it returns; the sync thread syncs a segment as it closes.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !synced(&trace).contains(&first) {
        assert!(
            std::time::Instant::now() < deadline,
            "the finished segment {} was not synced while the run went on",
            first.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The stop goes to vidflow, strace's child (strace holds a signal sent to it).
    let children = format!("/proc/{0}/task/{0}/children", running.pid());
    let vidflow = std::fs::read_to_string(children).unwrap();
    let status = Command::new("kill")
        .args(["-TERM", vidflow.trim()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = running.finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
}
