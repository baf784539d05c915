//! Real encoded video through the real `vidflow` binary: frames in, lines and frames out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn h264_mp4_gives_one_line_per_frame_in_order_and_a_video_as_long() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 90, 320, 240);
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.clip]
uri = "file://{}"

[executor]
workers = 2
max_in_flight = 3

[steps.small]
kind = "resize"
image = "$frame"
width = 160
height = 120

[steps.motion]
kind = "motion"
image = "$steps.small.image"
min_area = 20.0

[steps.overlay]
kind = "annotate"
image = "$steps.small.image"
detections = "$steps.motion.detections"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.motion.detections", "$steps.small.image"]

[sinks.video]
kind = "video_file"
path = "out/annotated.mp4"
image = "$steps.overlay.image"
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&pipeline, &["--stats-json", "stats.json"], dir.path())
        .finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);

    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 90);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["frame"], i as u64);
        assert_eq!(line["source"], "clip");
        assert!(line["steps.motion.detections"].is_array(), "{line}");
        assert_eq!(line["steps.small.image"]["width"], 160);
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
    }
    // Source timestamps are kept: 30 fps.
    assert!((lines[30]["pts_ms"].as_f64().unwrap() - 1000.0).abs() < 1.0);
    // A ball moves across the test pattern: motion is found in most frames.
    let with_motion = lines
        .iter()
        .filter(|l| !l["steps.motion.detections"].as_array().unwrap().is_empty())
        .count();
    assert!(
        with_motion > 45,
        "motion in only {with_motion} of 90 frames"
    );

    assert_eq!(
        count_video_frames(&dir.path().join("out/annotated.mp4")),
        90
    );
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_decoded"], 90);
    assert_eq!(stats["frames_processed"], 90);
    assert_eq!(stats["frames_failed"], 0);
    assert_eq!(stats["frames_dropped"], 0);
    assert_eq!(stats["sinks"]["events"]["written"], 90);
    assert_eq!(stats["sinks"]["video"]["written"], 90);
}

#[test]
fn every_n_frames_runs_a_step_on_those_frames_only_and_skips_its_readers() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 20, 160, 120);
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.clip]
uri = "file://{}"

[executor]
workers = 2
max_in_flight = 3

[steps.small]
kind = "resize"
image = "$frame"
width = 80
height = 60
every_n_frames = 3

[steps.gray]
kind = "grayscale"
image = "$steps.small.image"

[steps.always]
kind = "grayscale"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.small.image", "$steps.gray.image", "$steps.always.image"]
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&pipeline, &[], dir.path()).finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 20);
    for (i, line) in lines.iter().enumerate() {
        let runs = i % 3 == 0;
        assert_eq!(line["steps.small.image"].is_object(), runs, "{line}");
        assert_eq!(line["steps.gray.image"].is_object(), runs, "{line}");
        assert!(line["steps.always.image"].is_object(), "{line}");
        assert!(
            line.get("error").is_none(),
            "a skipped step is no failure: {line}"
        );
    }
}

/// What `make run` runs: the shipped demo on the street video, with its real detector.
#[test]
fn street_video_runs_through_the_demo_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    asset("vtest.avi");
    for linked in ["assets", "models"] {
        std::os::unix::fs::symlink(repo_root().join(linked), dir.path().join(linked)).unwrap();
    }
    // The demo as shipped, but on a port of its own: a vidflow already listening on the demo's
    // 9464 (the demo, the service) must not fail this test.
    let demo = std::fs::read_to_string(repo_root().join("pipelines/demo.toml")).unwrap();
    let listen = "listen = \"127.0.0.1:9464\"";
    assert!(
        demo.contains(listen),
        "the demo no longer listens on 9464: update this test"
    );
    let demo = demo.replace(listen, &format!("listen = \"127.0.0.1:{}\"", free_port()));
    let pipeline = dir.path().join("demo.toml");
    std::fs::write(&pipeline, demo).unwrap();
    let out = spawn_run(&pipeline, &["--stats-json", "stats.json"], dir.path())
        .finish(Duration::from_secs(900));
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 795);
    assert!(
        lines
            .iter()
            .enumerate()
            .all(|(i, l)| l["frame"] == i as u64)
    );
    // Pedestrians walk through the whole clip: most frames have people tracked, with IDs.
    let tracked = lines
        .iter()
        .filter(|l| {
            l["steps.tracks.tracks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["track_id"].as_u64().is_some_and(|id| id >= 1))
        })
        .count();
    assert!(tracked > 600, "people tracked on only {tracked} frames");
    // People cross the line both ways, every crossing an event, the counts their sums.
    let last = &lines[794]["steps.crossing.counts"];
    let events: Vec<&serde_json::Value> = lines
        .iter()
        .flat_map(|l| l["steps.crossing.events"].as_array().unwrap())
        .collect();
    let each_way = |way: &str| events.iter().filter(|e| e["event"] == way).count() as u64;
    assert!(each_way("in") >= 3 && each_way("out") >= 3, "{last}");
    assert_eq!(last["in"], each_way("in"));
    assert_eq!(last["out"], each_way("out"));
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["counts"]["street"]["crossing"], *last, "{stats}");
    assert!(
        out.stderr.contains(&format!(
            "final counts: street: crossing in={} out={}",
            last["in"], last["out"]
        )),
        "{}",
        out.stderr
    );
    // 79.5 s of video: a 60 s segment and the rest in the next.
    assert_eq!(segments(&dir.path().join("out/annotated.mp4")).len(), 2);
    assert_eq!(
        count_segment_frames(&dir.path().join("out/annotated.mp4")),
        795
    );
    assert_eq!(stats["frames_decoded"], 795);
    assert_eq!(stats["frames_processed"], 795);
}

#[test]
fn max_frames_stops_cleanly_after_that_many() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = write(
        dir.path(),
        "p.toml",
        r#"
[sources.cam]
uri = "test://smpte?width=160&height=120&live=false"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
"#,
    );
    let out = spawn_run(
        &pipeline,
        &["--max-frames", "25", "--stats-json", "s.json"],
        dir.path(),
    )
    .finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 25);
    let stats = read_json(&dir.path().join("s.json"));
    assert_eq!(stats["frames_decoded"], 25);
    assert_eq!(stats["frames_processed"], 25);
}
