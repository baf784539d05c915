//! Real signals to a real `vidflow run` on a live source: drain, finalize, report, exit 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;

const LIVE: &str = r#"
[sources.cam]
uri = "test://ball?width=320&height=240&fps=30"
# Room for two seconds of frames: a loaded test machine must not make this live source drop.
queue = 60

[executor]
workers = 2
max_in_flight = 2

[steps.motion]
kind = "motion"
image = "$frame"

[steps.overlay]
kind = "annotate"
image = "$frame"
detections = "$steps.motion.detections"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.motion.detections"]

[sinks.video]
kind = "video_file"
path = "out/live.mp4"
image = "$steps.overlay.image"
"#;

fn stop_with(signal_name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = write(dir.path(), "live.toml", LIVE);
    let running = spawn_run(&pipeline, &["--stats-json", "stats.json"], dir.path());
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        30,
        Duration::from_secs(60),
    );
    running.signal(signal_name);
    let out = running.finish(Duration::from_secs(60));
    let stderr = &out.stderr;
    assert!(
        out.status.success(),
        "exit {:?}: {stderr}",
        out.status.code()
    );
    assert!(stderr.contains("stop requested"), "{stderr}");

    let stats = read_json(&dir.path().join("stats.json"));
    let decoded = stats["frames_decoded"].as_u64().unwrap();
    let processed = stats["frames_processed"].as_u64().unwrap();
    assert!(processed >= 30);
    assert_eq!(
        processed, decoded,
        "every decoded frame is processed: {stats}"
    );
    assert_eq!(stats["frames_dropped"], 0);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len() as u64, processed);
    assert!(
        lines
            .iter()
            .enumerate()
            .all(|(i, l)| l["frame"] == i as u64)
    );
    assert_eq!(stats["sinks"]["video"]["written"], processed);
    assert_eq!(
        count_video_frames(&dir.path().join("out/live.mp4")),
        processed
    );
    eprintln!(
        "{signal_name}: decoded {decoded}, processed {processed}, lines {}",
        lines.len()
    );
}

#[test]
fn sigterm_drains_every_decoded_frame_and_finalizes_the_video() {
    stop_with("TERM");
}

#[test]
fn sigint_drains_every_decoded_frame_and_finalizes_the_video() {
    stop_with("INT");
}

#[test]
fn second_signal_stops_at_once_but_still_closes_the_sinks() {
    let dir = tempfile::tempdir().unwrap();
    // Not live and slow to process (a wide blur on 1080p): the source is far ahead of the
    // workflow, so a graceful drain takes seconds and frames are still queued when the second
    // signal comes.
    let pipeline = write(
        dir.path(),
        "slow.toml",
        r#"
[sources.cam]
uri = "test://snow?width=1920&height=1080&live=false"

[executor]
workers = 1
max_in_flight = 1

[steps.blur]
kind = "blur"
image = "$frame"
kernel = 151

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"

[sinks.video]
kind = "video_file"
path = "out/slow.mkv"
image = "$steps.blur.image"
"#,
    );
    let running = spawn_run(&pipeline, &["--stats-json", "stats.json"], dir.path());
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        1,
        Duration::from_secs(60),
    );
    running.signal("TERM");
    // Signals of one kind merge while pending: send the second once the first was handled.
    running.wait_for_stderr("stop requested", Duration::from_secs(30));
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(60));
    let stderr = &out.stderr;
    assert!(
        out.status.success(),
        "exit {:?}: {stderr}",
        out.status.code()
    );
    assert!(stderr.contains("second stop request"), "{stderr}");

    let stats = read_json(&dir.path().join("stats.json"));
    let n = |k: &str| stats[k].as_u64().unwrap();
    assert_eq!(
        n("frames_decoded"),
        n("frames_processed") + n("frames_failed") + n("frames_dropped"),
        "every decoded frame is accounted for: {stats}"
    );
    assert!(
        n("frames_dropped") > 0,
        "queued frames were not dropped: {stats}"
    );
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len() as u64, n("frames_processed"));
    assert_eq!(
        count_video_frames(&dir.path().join("out/slow.mkv")),
        n("frames_processed")
    );
}
