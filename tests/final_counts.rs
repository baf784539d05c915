//! The end-of-run report of the real `vidflow` binary gives, per source, the last counts of
//! every step that outputs counts: in its log and in the stats JSON. Two real H.264 clips made
//! at test time (`common::shapes`), one per source, real steps (motion -> tracker ->
//! line_counter): the counts must be each source's own and equal to the last value its JSON
//! lines carry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::shapes::{Form, Mover, Scene};
use common::*;

/// Only a guard against a hang: two 60-frame clips on a busy machine.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

fn mover(name: &'static str, y: f32, from: f32, to: f32) -> Mover {
    Mover {
        name,
        form: Form::Rect,
        colour: [40, 40, 220],
        width: 36,
        height: 36,
        path: vec![(0, from, y), (59, to, y)],
    }
}

/// A 60-frame clip of the movers crossing x = 160 (east: left to right; west: right to left).
fn clip(path: &Path, movers: Vec<Mover>) {
    Scene {
        width: 320,
        height: 240,
        fps: 10,
        frames: 60,
        background: [96, 96, 96],
        movers,
        occluders: Vec::new(),
    }
    .write_mp4(path);
}

#[test]
fn the_run_reports_the_last_counts_of_each_source() {
    let dir = tempfile::tempdir().unwrap();
    let both = dir.path().join("both.mp4");
    let east = dir.path().join("east.mp4");
    clip(
        &both,
        vec![
            mover("east", 40.0, 0.0, 280.0),
            mover("west", 150.0, 280.0, 0.0),
        ],
    );
    clip(&east, vec![mover("east", 40.0, 0.0, 280.0)]);
    // The line goes up the middle of the picture: "in" is to its right, eastwards.
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.both]
uri = "{}"

[sources.east]
uri = "{}"

[steps.motion]
kind = "motion"
image = "$frame"
min_area = 200.0

[steps.tracks]
kind = "tracker"
detections = "$steps.motion.detections"

[steps.middle]
kind = "line_counter"
tracks = "$steps.tracks.tracks"
line = [[160, 240], [160, 0]]

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.middle.counts"]
"#,
            both.display(),
            east.display()
        ),
    );
    let out = spawn(
        dir.path(),
        &[
            "run",
            pipeline.to_str().unwrap(),
            "--stats-json",
            "stats.json",
        ],
        &[],
    )
    .finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);

    assert!(
        out.stderr.contains("final counts: both: middle in=1 out=1"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("final counts: east: middle in=1 out=0"),
        "{}",
        out.stderr
    );
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(
        stats["counts"],
        serde_json::json!({"both": {"middle": {"in": 1, "out": 1}},
                           "east": {"middle": {"in": 1, "out": 0}}})
    );
    // The same as the last line of each source.
    let lines = jsonl(&dir.path().join("events.jsonl"));
    for source in ["both", "east"] {
        let last = lines.iter().rev().find(|l| l["source"] == source).unwrap();
        assert_eq!(
            last["steps.middle.counts"],
            stats["counts"][source]["middle"]
        );
    }
}
