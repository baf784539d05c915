//! Step failures through the real binary: a frame fails, the pipeline goes on or stops as
//! configured, and the sinks are closed either way. The failing step is a real `crop` whose
//! rectangle does not fit the real decoded frames.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;

fn pipeline(policy: &str) -> String {
    format!(
        r#"
[sources.cam]
uri = "test://ball?width=320&height=240&live=false&frames=40"

[executor]
workers = 2
on_step_error = "{policy}"

[steps.grey]
kind = "grayscale"
image = "$frame"

[steps.roi]
kind = "crop"
image = "$steps.grey.image"
x = 200
width = 200
height = 100

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.motion.detections", "$steps.grey.image", "$steps.roi.image"]

[sinks.video]
kind = "video_file"
path = "out/frames.mkv"
image = "$frame"
"#
    )
}

#[test]
fn a_failing_step_fails_its_frames_and_the_pipeline_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.toml", &pipeline("skip_frame"));
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("step failed"), "{}", out.stderr);
    assert!(
        out.stderr.contains("roi"),
        "the log names the step: {}",
        out.stderr
    );

    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 40);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["frame"], i as u64);
        assert_eq!(l["error"]["step"], "roi");
        let message = l["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("does not fit the 320x240 image"),
            "{message}"
        );
        // What was computed before the failure is kept: `grey` always runs before `roi`.
        assert!(l["steps.grey.image"].is_object(), "{l}");
        assert!(l["steps.roi.image"].is_null(), "{l}");
    }
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_decoded"], 40);
    assert_eq!(stats["frames_failed"], 40);
    assert_eq!(stats["frames_processed"], 0);
    assert_eq!(count_video_frames(&dir.path().join("out/frames.mkv")), 40);
}

#[test]
fn with_stop_the_daemon_drains_closes_its_sinks_and_exits_70() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.toml", &pipeline("stop"));
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(70), "{}", out.stderr);
    assert!(
        out.stderr.contains("on_step_error = \"stop\""),
        "{}",
        out.stderr
    );

    let stats = read_json(&dir.path().join("stats.json"));
    let n = |k: &str| stats[k].as_u64().unwrap();
    assert!(n("frames_failed") >= 1);
    // The source may well have decoded all 40 frames before the stop (a fast machine does):
    // what stops is the workflow. The frames it never ran are counted as dropped.
    assert!(
        n("frames_processed") + n("frames_failed") < 40,
        "it did not stop: {stats}"
    );
    assert_eq!(
        n("frames_decoded"),
        n("frames_processed") + n("frames_failed") + n("frames_dropped"),
        "{stats}"
    );
    // Every frame admitted before the stop was drained to the sinks, which were finalized.
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len() as u64, n("frames_failed"));
    assert_eq!(
        count_video_frames(&dir.path().join("out/frames.mkv")),
        n("frames_failed")
    );
}

#[test]
fn a_filter_that_ends_its_branch_skips_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    // A still pattern: no motion after the first frame, so the filter ends the branch. The
    // steps that need its detections are skipped (here a second filter);
    // `annotate`, whose detections are optional, still draws every frame, without boxes.
    let p = write(
        dir.path(),
        "p.toml",
        r#"
[sources.cam]
uri = "test://smpte?width=160&height=120&live=false&frames=20"

[steps.motion]
kind = "motion"
image = "$frame"

[steps.moving]
kind = "filter"
detections = "$steps.motion.detections"
skip_if_empty = true

[steps.overlay]
kind = "annotate"
image = "$frame"
detections = "$steps.moving.detections"

[steps.kept]
kind = "filter"
detections = "$steps.moving.detections"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.moving.detections", "$steps.kept.detections"]

[sinks.video]
kind = "video_file"
path = "annotated.mp4"
image = "$steps.overlay.image"
"#,
    );
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_processed"], 20);
    assert_eq!(stats["frames_failed"], 0);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    let skipped = lines
        .iter()
        .filter(|l| l["steps.moving.detections"].is_null())
        .count() as u64;
    assert!(skipped >= 15, "{skipped} of 20 frames skipped");
    // The branch's reader is skipped on exactly those frames, none failed.
    for line in &lines {
        assert_eq!(
            line["steps.kept.detections"].is_null(),
            line["steps.moving.detections"].is_null(),
            "{line}"
        );
        assert!(line.get("error").is_none(), "{line}");
    }
    assert_eq!(stats["sinks"]["video"]["written"], 20);
}

#[test]
fn a_still_image_is_a_one_shot_run_with_its_own_pool() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("still.png");
    run_to_eos(&format!(
        "videotestsrc pattern=smpte num-buffers=1 ! video/x-raw,width=320,height=240 ! \
         videoconvert ! pngenc ! filesink location={}",
        image.display()
    ));
    let with_steps = |steps: &str| {
        format!(
            r#"
[sources.photo]
uri = "{}"
{steps}
[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = [{}]
"#,
            image.display(),
            // Every step read, so that every step runs.
            ["gray", "soft"]
                .iter()
                .filter(|s| steps.contains(&format!("[steps.{s}]")))
                .map(|s| format!("\"$steps.{s}.image\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let p = write(
        dir.path(),
        "p.toml",
        // Two branches: the coordinator runs one, the other needs the pool.
        &with_steps(
            "[steps.gray]\nkind = \"grayscale\"\nimage = \"$frame\"\n\
             [steps.soft]\nkind = \"blur\"\nimage = \"$frame\"\n",
        ),
    );
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_processed"], 1);
    assert_eq!(stats["pool"]["pools_built"], 1);
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 1);

    // No step, nothing dispatched: the one-shot pool is never built.
    let p = write(dir.path(), "p.toml", &with_steps(""));
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_processed"], 1);
    assert_eq!(stats["pool"]["pools_built"], 0);
}

/// The frames counted in `stderr` for step `step`: one per first failure line, plus those of
/// each "failed on N more frame(s)" line.
fn failures_logged(stderr: &str, step: &str) -> (usize, u64) {
    let first = stderr
        .lines()
        .filter(|l| {
            l.contains("step failed; frame skipped") && l.contains(&format!("step={step} "))
        })
        .count();
    let prefix = format!("step \"{step}\" failed on ");
    let more: u64 = stderr
        .lines()
        .filter_map(|l| l.split_once(&prefix))
        .map(|(_, rest)| rest.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    (first, more)
}

#[test]
fn a_step_failing_on_every_frame_is_said_once_then_counted() {
    // A step that fails on every frame of an 11-second live source is said once in full, then
    // as counts (every 10 s, and at the end), which add up to every failure. (Before, one line
    // per frame: 330.)
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        r#"
[sources.cam]
uri = "test://ball?width=160&height=120&fps=30&live=true&frames=330"
queue = 60

[steps.roi]
kind = "crop"
image = "$frame"
x = 100
width = 100
height = 50

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
"#,
    );
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(90));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    let failed = stats["frames_failed"].as_u64().unwrap();
    assert_eq!(
        failed + stats["frames_dropped"].as_u64().unwrap(),
        330,
        "{stats}"
    );
    let (first, more) = failures_logged(&out.stderr, "roi");
    assert_eq!(first, 1, "{}", out.stderr);
    assert_eq!(1 + more, failed, "{}", out.stderr);
    let lines = out.stderr.lines().filter(|l| l.contains(" WARN ")).count();
    assert!(lines < 10, "{lines} warnings:\n{}", out.stderr);
}
