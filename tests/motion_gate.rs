//! Motion-gated detection through the real `vidflow` binary: `motion` -> `filter` with
//! `skip_if_empty` -> `object_detection` with `when`, on real GStreamer test patterns (a still
//! black picture, a moving ball) and the real yolov3_tiny_coco model: the network runs only on
//! frames where something moves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;

/// Only a guard against a hang: a few dozen frames of a small network on a busy machine.
const RUN_DEADLINE: Duration = Duration::from_secs(300);
const FRAMES: usize = 30;

/// Runs the pipeline on `pattern` (gated or not); per frame, whether the detector ran.
fn detector_ran(pattern: &str, gated: bool) -> Vec<bool> {
    let dir = tempfile::tempdir().unwrap();
    let when = if gated {
        "when = \"$steps.moving.detections\""
    } else {
        ""
    };
    let path = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "test://{pattern}"

[steps.motion]
kind = "motion"
image = "$frame"

[steps.moving]
kind = "filter"
detections = "$steps.motion.detections"
skip_if_empty = true

[steps.detect]
kind = "object_detection"
image = "$frame"
{when}
input_size = 128

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.detect.detections"]
"#
        ),
    );
    let models = repo_root().join("models");
    let out = spawn(
        dir.path(),
        &[
            "run",
            path.to_str().unwrap(),
            "--max-frames",
            &FRAMES.to_string(),
        ],
        &[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())],
    )
    .finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    // A live source drops frames the workflow is too busy for: some lines, not one per frame.
    assert!(!lines.is_empty());
    lines
        .iter()
        .map(|l| !l["steps.detect.detections"].is_null())
        .collect()
}

#[test]
fn a_gated_detector_runs_only_on_frames_where_something_moves() {
    // Nothing moves: the gated network never runs (the frames are processed, not failed),
    // but on the first frame, which MOG2 sees as all foreground (no background learnt yet).
    let still = detector_ran("black", true);
    assert!(
        still.len() > 1 && still[1..].iter().all(|ran| !ran),
        "{still:?}"
    );
    // Without the gate it runs on every frame.
    let ungated = detector_ran("black", false);
    assert!(ungated.iter().all(|ran| *ran), "{ungated:?}");
    // A moving ball: it runs once the background is learnt (motion's first frames find
    // nothing), on most frames.
    let moving = detector_ran("ball", true);
    let ran = moving.iter().filter(|r| **r).count();
    assert!(ran >= moving.len() / 2, "{moving:?}");
}
