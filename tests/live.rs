//! Live-source behaviour through the real binary: a live source keeps the newest frames when
//! the workflow is behind, a file never drops, sources are independent, `max_fps` throttles and
//! `loop` restarts a file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

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
"#;

/// Tails a JSONL file while a run goes on; returns each line with the time it appeared.
fn tail_lines(
    path: &std::path::Path,
    running: &mut Running,
    max: Duration,
) -> Vec<(Instant, serde_json::Value)> {
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < max && running.is_running() {
        if let Ok(text) = std::fs::read_to_string(path) {
            // Only whole lines: the last one may still be being written.
            let complete = text.rsplit_once('\n').map_or("", |(whole, _)| whole);
            for line in complete.lines().skip(seen.len()) {
                seen.push((Instant::now(), serde_json::from_str(line).unwrap()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    seen
}

#[test]
fn a_slow_workflow_on_a_live_source_gets_recent_frames_and_counts_drops() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("[sources.cam]\nuri = \"test://ball?width=640&height=480&fps=30\"\n{SLOW}");
    let p = write(dir.path(), "p.toml", &text);
    let mut running = spawn_run(&p, &["--stats-json", "stats.json"], dir.path());
    let lines = tail_lines(
        &dir.path().join("events.jsonl"),
        &mut running,
        Duration::from_secs(5),
    );
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(lines.len() > 10, "only {} frames in 5 s", lines.len());

    // How far each frame reaching the sink lags behind the source's own clock: the arrival
    // time minus the source timestamp, both counted from the first frame. Blocking the
    // source would make this grow by ~1.5 s per second; dropping keeps it flat.
    let (t0, first) = &lines[0];
    let pts0 = first["pts_ms"].as_f64().unwrap();
    let lag_ms = |(t, l): &(Instant, serde_json::Value)| {
        t.duration_since(*t0).as_secs_f64() * 1000.0 - (l["pts_ms"].as_f64().unwrap() - pts0)
    };
    let worst = lines.iter().map(lag_ms).fold(f64::MIN, f64::max);
    assert!(worst < 1000.0, "frames reached the sink {worst:.0} ms late");
    // Frame numbers have gaps where frames were dropped, but never go back.
    let frames: Vec<u64> = lines
        .iter()
        .map(|(_, l)| l["frame"].as_u64().unwrap())
        .collect();
    assert!(frames.windows(2).all(|w| w[0] < w[1]));

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
uri = "test://snow?width=160&height=120&fps=30&frames=90"

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
    assert_eq!(stats["sources"]["long"]["decoded"], 90);
    assert_eq!(stats["frames_processed"], 105);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    for source in ["short", "long"] {
        let frames: Vec<u64> = lines
            .iter()
            .filter(|l| l["source"] == source)
            .map(|l| l["frame"].as_u64().unwrap())
            .collect();
        let expected = if source == "short" { 15 } else { 90 };
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
    // The file's own timestamps start again at each pass.
    assert_eq!(lines[10]["pts_ms"], 0.0);
    assert_eq!(lines[20]["pts_ms"], 0.0);
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
