//! Live-source behaviour through the real binary: a live source keeps the newest frames when
//! the workflow is behind, a file never drops, sources are independent, `max_fps` throttles and
//! `loop` restarts a file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;

/// A workflow over twice as slow as a 30 fps source on this machine (a wide blur on one
/// worker, one frame at a time).
const SLOW: &str = r#"
[executor]
workers = 1
max_in_flight = 1

[steps.blur]
kind = "blur"
image = "$frame"
kernel = 201

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.blur.image"]
"#;

#[test]
fn a_slow_workflow_on_a_live_source_gets_recent_frames_and_counts_drops() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("[sources.cam]\nuri = \"test://ball?width=640&height=480&fps=30\"\n{SLOW}");
    let p = write(dir.path(), "p.toml", &text);
    let events = dir.path().join("events.jsonl");
    let running = spawn_run(&p, &["--stats-json", "stats.json"], dir.path());
    // Enough frames through the slow workflow for the source to have run ahead of it.
    wait_for_lines(&events, 8, Duration::from_secs(120));
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);

    let stats = read_json(&dir.path().join("stats.json"));
    let n = |k: &str| stats[k].as_u64().unwrap();
    assert!(n("frames_dropped") > 0, "{stats}");
    assert_eq!(
        n("frames_decoded"),
        n("frames_processed") + n("frames_dropped"),
        "{stats}"
    );
    assert_eq!(
        stats["sources"]["cam"]["dropped"].as_u64().unwrap(),
        n("frames_dropped")
    );
    // Frame numbers have gaps where frames were dropped, but never go back; the source did not
    // wait for the workflow (that would leave no gap).
    let frames: Vec<u64> = jsonl(&events)
        .iter()
        .map(|l| l["frame"].as_u64().unwrap())
        .collect();
    assert!(frames.windows(2).all(|w| w[0] < w[1]), "{frames:?}");
    assert!(frames.windows(2).any(|w| w[1] > w[0] + 1), "{frames:?}");
    // The oldest queued frame is the one dropped: the newest frame the source decoded is
    // always delivered, so the run ends on it (dropping the newest would end on an old one).
    assert_eq!(
        frames.last().copied(),
        Some(n("frames_decoded") - 1),
        "{stats}"
    );
}

#[test]
fn the_same_slow_workflow_on_a_file_drops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 40, 640, 480);
    let text = format!("[sources.clip]\nuri = \"{}\"\n{SLOW}", clip.display());
    let p = write(dir.path(), "p.toml", &text);
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_decoded"], 40);
    assert_eq!(stats["frames_processed"], 40);
    assert_eq!(stats["frames_dropped"], 0);
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 40);
}

#[test]
fn two_sources_feed_one_workflow_and_one_ending_does_not_stop_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("short.mp4");
    make_h264_mp4(&clip, 15, 320, 240);
    let text = format!(
        r#"
[sources.short]
uri = "{}"

[sources.long]
# 6 s of live frames: the file ends long before, however slowly a busy machine starts it.
uri = "test://snow?width=160&height=120&fps=10&frames=60"
# Room for the whole stream: this test is about independence, not about live drops.
queue = 60

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.motion.detections"]
"#,
        clip.display()
    );
    let p = write(dir.path(), "p.toml", &text);
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["sources"]["short"]["decoded"], 15);
    assert_eq!(stats["sources"]["long"]["decoded"], 60);
    assert_eq!(stats["frames_processed"], 75);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    for source in ["short", "long"] {
        let frames: Vec<u64> = lines
            .iter()
            .filter(|l| l["source"] == source)
            .map(|l| l["frame"].as_u64().unwrap())
            .collect();
        let expected = if source == "short" { 15 } else { 60 };
        assert_eq!(frames, (0..expected).collect::<Vec<_>>(), "{source}");
    }
    // The long source went on after the short one ended.
    let last_short = lines.iter().rposition(|l| l["source"] == "short").unwrap();
    assert!(
        lines[last_short + 1..]
            .iter()
            .filter(|l| l["source"] == "long")
            .count()
            > 30
    );
}

#[test]
fn max_fps_throttles_before_conversion_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        r#"
[sources.cam]
uri = "test://ball?width=320&height=240&fps=30&frames=90&live=false"
max_fps = 5

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
"#,
    );
    let out =
        spawn_run(&p, &["--stats-json", "stats.json"], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    let decoded = stats["frames_decoded"].as_u64().unwrap();
    // Three seconds of stream at 5 fps.
    assert!((14..=16).contains(&decoded), "{stats}");
    assert_eq!(
        stats["sources"]["cam"]["throttled"].as_u64().unwrap() + decoded,
        90
    );
    let pts: Vec<f64> = jsonl(&dir.path().join("events.jsonl"))
        .iter()
        .map(|l| l["pts_ms"].as_f64().unwrap())
        .collect();
    assert!(pts.windows(2).all(|w| w[1] - w[0] >= 190.0), "{pts:?}");
}

#[test]
fn a_looping_file_starts_again_and_frame_numbers_continue() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 10, 160, 120);
    let text = format!(
        "[sources.clip]\nuri = \"{}\"\nloop = true\n\n[sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n",
        clip.display()
    );
    let p = write(dir.path(), "p.toml", &text);
    let out = spawn_run(
        &p,
        &["--max-frames", "25", "--stats-json", "stats.json"],
        dir.path(),
    )
    .finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    let frames: Vec<u64> = lines.iter().map(|l| l["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames, (0..25).collect::<Vec<_>>());
    // Timestamps go on from pass to pass, as frame numbers do (a video sink needs them to).
    let pts: Vec<f64> = lines
        .iter()
        .map(|l| l["pts_ms"].as_f64().unwrap())
        .collect();
    assert!(pts.windows(2).all(|w| w[0] < w[1]), "{pts:?}");
    assert!(pts[10] >= pts[9] + 30.0, "{pts:?}");
}

/// A Matroska file with a video track and no frame: the 1-frame file cut before its first
/// cluster. It opens and ends at once, without an error.
fn file_without_frames(dir: &std::path::Path) -> std::path::PathBuf {
    let one = dir.join("one.mkv");
    run_to_eos(&format!(
        "videotestsrc num-buffers=1 ! video/x-raw,format=I420,width=160,height=120 ! \
         x264enc ! h264parse ! matroskamux ! filesink location={}",
        one.display()
    ));
    let bytes = std::fs::read(&one).unwrap();
    let cluster = [0x1F, 0x43, 0xB6, 0x75];
    let at = bytes.windows(4).position(|w| w == cluster).unwrap();
    let zero = dir.join("zero.mkv");
    std::fs::write(&zero, &bytes[..at]).unwrap();
    zero
}

#[test]
fn a_looping_file_without_frames_backs_off_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let clip = file_without_frames(dir.path());
    let text = format!(
        "[sources.clip]\nuri = \"{}\"\nloop = true\n\n\
         [sources.clip.reconnect]\ninitial_delay_ms = 100\nmax_delay_ms = 400\n\n\
         [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n",
        clip.display()
    );
    let p = write(dir.path(), "p.toml", &text);
    let run = spawn(
        dir.path(),
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[("VIDFLOW_LOG", "debug")],
    );
    // The delays the supervisor chose, from its debug log.
    run.wait_for_stderr_times("next attempt after backoff", 5, Duration::from_secs(30));
    run.signal("TERM");
    let out = run.finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("the file ends at once").count(),
        1,
        "{}",
        out.stderr
    );
    let delays: Vec<u64> = out
        .stderr
        .lines()
        .filter(|l| l.contains("next attempt after backoff"))
        .map(|l| {
            let at = l.find("delay_ms=").unwrap() + "delay_ms=".len();
            l[at..].split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    // 100 ms doubling up to 400 ms, each within +-20% and never above the cap.
    for (i, &d) in delays.iter().enumerate() {
        let base = (100u64 << i.min(2)).min(400);
        assert!(
            d * 10 >= base * 8 && d * 10 <= (base * 12).min(4000),
            "delay {i}: {d} ms, expected about {base}: {delays:?}"
        );
    }
    // Every pass after the first waited: one attempt per backoff, plus the first (and the one
    // the stop may have cut short).
    let stats = read_json(&dir.path().join("stats.json"));
    let attempts = stats["sources"]["clip"]["attempts"].as_u64().unwrap();
    let waits = delays.len() as u64;
    assert!(
        attempts == waits || attempts == waits + 1,
        "{attempts} attempts for {waits} backoffs: {stats}"
    );
    assert_eq!(stats["frames_decoded"], 0, "{stats}");
}

#[test]
fn a_missing_camera_is_a_clear_error_and_exit_69() {
    // These machines have no /dev/video*: the real v4l2 path up to the device check.
    let dir = tempfile::tempdir().unwrap();
    let device = "/dev/video57";
    assert!(!std::path::Path::new(device).exists());
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"v4l2://{device}?width=1280&height=720&format=mjpg\"\n\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"
        ),
    );
    let out = spawn_run(&p, &[], dir.path()).finish(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("source \"cam\" (v4l2:///dev/video57): no such camera device"),
        "{}",
        out.stderr
    );
}
