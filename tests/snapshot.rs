//! The `snapshot` sink on the real `vidflow` binary: JPEGs written exactly when a value is
//! non-empty and the cooldown has passed (in the source's time), crops around detections, and
//! a second run that keeps the first run's files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use opencv::core::MatTraitConst;
use opencv::imgcodecs;

/// Only a guard against a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(120);
/// Between frames (13.5 frames at 30 fps), so that no frame sits on the boundary.
const COOLDOWN_MS: f64 = 450.0;

fn pipeline(dir: &Path, crops: bool) -> std::path::PathBuf {
    let crops = if crops {
        "crops = \"$steps.motion.detections\"\npadding = 0.0"
    } else {
        ""
    };
    write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.cam]
# Not paced: this test is about the cooldown rule, not about a live source's drops.
uri = "test://ball?width=320&height=240&fps=30&frames=60&live=false"

[steps.motion]
kind = "motion"
image = "$frame"
min_area = 20.0

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.motion.detections"]

[sinks.snap]
kind = "snapshot"
dir = "out/snap"
image = "$frame"
when = "$steps.motion.detections"
cooldown_s = {}
{crops}
"#,
            COOLDOWN_MS / 1000.0
        ),
    )
}

/// The frames the cooldown rule picks from the JSONL: motion found, and the last pick at least
/// the cooldown earlier in the source's timestamps.
fn expected_frames(lines: &[serde_json::Value]) -> BTreeSet<u64> {
    let mut last: Option<f64> = None;
    let mut picked = BTreeSet::new();
    for line in lines {
        let moving = !line["steps.motion.detections"]
            .as_array()
            .unwrap()
            .is_empty();
        let pts = line["pts_ms"].as_f64().unwrap();
        if moving && last.is_none_or(|l| pts - l >= COOLDOWN_MS) {
            picked.insert(line["frame"].as_u64().unwrap());
            last = Some(pts);
        }
    }
    picked
}

/// JPEG files in `dir` by name.
fn snapshots(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".jpg"))
        .collect();
    names.sort();
    names
}

/// The frame number in `cam-000015-20261201T...Z.jpg`.
fn frame_of(name: &str) -> u64 {
    name.split('-').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_snapshot_is_written_when_its_value_is_non_empty_and_the_cooldown_passed() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), false);
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 60);
    let expected = expected_frames(&lines);
    assert!(expected.len() >= 3, "the ball moves: {expected:?}");
    let names = snapshots(&dir.path().join("out/snap"));
    let got: BTreeSet<u64> = names.iter().map(|n| frame_of(n)).collect();
    assert_eq!(got, expected, "{names:?}");
    for name in &names {
        assert!(
            name.starts_with("cam-") && name.ends_with("Z.jpg"),
            "{name}"
        );
        let image = imgcodecs::imread_def(dir.path().join("out/snap").join(name).to_str().unwrap())
            .unwrap();
        assert_eq!((image.cols(), image.rows()), (320, 240), "{name}");
    }

    // A second run into the same folder adds its files and keeps the first run's.
    let before: BTreeSet<(String, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let bytes = std::fs::read(dir.path().join("out/snap").join(n)).unwrap();
            (n.clone(), bytes)
        })
        .collect();
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let after = snapshots(&dir.path().join("out/snap"));
    assert!(after.len() >= 2 * names.len(), "{after:?}");
    for (name, bytes) in before {
        let now = std::fs::read(dir.path().join("out/snap").join(&name)).unwrap();
        assert_eq!(now, bytes, "{name} was changed by the second run");
    }
}

#[test]
fn crops_are_one_jpeg_per_detection_the_size_of_its_box() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), true);
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    let names = snapshots(&dir.path().join("out/snap"));
    let expected = expected_frames(&lines);
    let mut crops = 0;
    for frame in &expected {
        let line = lines.iter().find(|l| l["frame"] == *frame).unwrap();
        let boxes = line["steps.motion.detections"].as_array().unwrap();
        for (i, d) in boxes.iter().enumerate() {
            let prefix = format!("cam-{frame:06}-");
            let suffix = format!("-{i}-{}.jpg", d["class"].as_str().unwrap());
            let name = names
                .iter()
                .find(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
                .unwrap_or_else(|| panic!("no crop {prefix}*{suffix} in {names:?}"));
            let image =
                imgcodecs::imread_def(dir.path().join("out/snap").join(name).to_str().unwrap())
                    .unwrap();
            let b = &d["box"];
            let size = |k: &str| b[k].as_f64().unwrap().round() as i32;
            assert!(
                (image.cols() - size("width")).abs() <= 1
                    && (image.rows() - size("height")).abs() <= 1,
                "{name}: {}x{} for box {b}",
                image.cols(),
                image.rows()
            );
            crops += 1;
        }
    }
    assert_eq!(names.len(), crops, "{names:?}");
}
