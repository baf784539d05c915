//! Speeds in real units on a clip made at test time, with exact expectations.
//!
//! A camera looks down a road: the ground rectangle 10 m x 20 m is seen as a trapezoid of a
//! 640x480 picture (the homography [`IMAGE`] -> [`GROUND`]). One solid box walks a straight
//! line on the ground at [`SPEED_MS`], its bottom centre drawn each frame at the pixel the
//! homography gives for its ground place: far from the camera it moves fewer pixels a frame, so
//! only a speed measured on the ground is steady. The clip is real H.264, decoded by the real
//! `vidflow` binary, found by `motion` (MOG2 background subtraction) and followed by `tracker`;
//! its tracks come out of a `jsonl` sink.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::shapes::{Form, Mover, Scene};
use common::*;
use vidflow::frame::Ground;

const SIZE: (u32, u32) = (640, 480);
/// Four corners of a 10 m x 20 m rectangle of road, and where the camera sees them.
const IMAGE: [[f64; 2]; 4] = [
    [200.0, 400.0],
    [440.0, 400.0],
    [380.0, 100.0],
    [260.0, 100.0],
];
const GROUND: [[f64; 2]; 4] = [[0.0, 0.0], [10.0, 0.0], [10.0, 20.0], [0.0, 20.0]];
/// The walk: from `FROM` to `TO` (metres) at `SPEED_MS`, after `STILL` frames of empty road
/// (for MOG2 to learn it).
const FROM: [f64; 2] = [2.0, 2.0];
const TO: [f64; 2] = [8.0, 16.0];
const SPEED_MS: f64 = 4.0;
const FPS: i32 = 25;
const STILL: u32 = 20;
/// The box drawn, pixels.
const BOX: (i32, i32) = (24, 36);
/// How far a settled speed may be from the truth, as a share of it.
const SPEED_TOLERANCE: f64 = 0.03;
/// How far a reported ground place may be from the walked line, metres: `motion`'s box is a
/// pixel taller than the shape (its mask is dilated by one pixel) and the shape is drawn at
/// whole pixels, and at the far end of the walk a pixel of height is about 10 cm of road, 4 cm
/// across the walk's slant (measured: at most 6 cm).
const PATH_TOLERANCE_M: f64 = 0.08;
/// The tracker's default `speed_window_s` (a speed is settled one window after the first).
const WINDOW_S: f64 = 1.5;

/// The clip: the box's top-left corner on every frame of the walk.
fn scene(ground: &Ground) -> Scene {
    let length = (TO[0] - FROM[0]).hypot(TO[1] - FROM[1]);
    let walk_frames = (length / SPEED_MS * f64::from(FPS)).floor() as u32;
    let path = (0..=walk_frames)
        .map(|f| {
            let s = f64::from(f) / f64::from(FPS) * SPEED_MS / length;
            let at = [
                FROM[0] + (TO[0] - FROM[0]) * s,
                FROM[1] + (TO[1] - FROM[1]) * s,
            ];
            let [x, y] = ground.to_image(at, (640, 480)).unwrap();
            (
                STILL + f,
                (x - f64::from(BOX.0) / 2.0) as f32,
                (y - f64::from(BOX.1)) as f32,
            )
        })
        .collect();
    Scene {
        width: 640,
        height: 480,
        fps: FPS,
        frames: STILL + walk_frames + 1,
        background: [90, 90, 90],
        movers: vec![Mover {
            name: "walker",
            form: Form::Rect,
            colour: [30, 200, 230],
            width: BOX.0,
            height: BOX.1,
            path,
        }],
        occluders: Vec::new(),
    }
}

/// One reported track: frame, ground place and speed (km/h or px/s) as the JSON has them.
#[derive(Debug)]
struct Seen {
    frame: u64,
    ground: Option<[f64; 2]>,
    kmh: Option<f64>,
    px_s: Option<f64>,
}

/// Runs the clip through motion and tracker, with the calibration or without; every track of
/// every frame.
fn run_clip(calibrated: bool) -> Vec<Seen> {
    let ground = Ground::fit(SIZE, &IMAGE, &GROUND).unwrap();
    let scene = scene(&ground);
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("road.mp4");
    scene.write_mp4(&clip);
    let points = |ps: &[[f64; 2]]| {
        ps.iter()
            .map(|[x, y]| format!("[{x}, {y}]"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let calibration = if calibrated {
        format!(
            "[sources.road.calibration]\nsize = [{}, {}]\nimage = [{}]\nground = [{}]\n",
            SIZE.0,
            SIZE.1,
            points(&IMAGE),
            points(&GROUND)
        )
    } else {
        String::new()
    };
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.road]
uri = "{}"

{calibration}
[executor]
workers = 2

[steps.moving]
kind = "motion"
image = "$frame"

[steps.follow]
kind = "tracker"
detections = "$steps.moving.detections"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.follow.tracks"]
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&pipeline, &[], dir.path()).finish(vision::RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    assert_eq!(lines.len(), scene.frames as usize);
    let mut seen = Vec::new();
    for line in &lines {
        for t in line["steps.follow.tracks"].as_array().unwrap() {
            let number = |k: &str| t[k].as_f64();
            seen.push(Seen {
                frame: line["frame"].as_u64().unwrap(),
                ground: t["ground"]
                    .as_array()
                    .map(|g| [g[0].as_f64().unwrap(), g[1].as_f64().unwrap()]),
                kmh: number("speed_kmh"),
                px_s: number("speed_px_s"),
            });
        }
    }
    seen
}

/// Distance of `p` from the walked line, metres.
fn off_path(p: [f64; 2]) -> f64 {
    let (dx, dy) = (TO[0] - FROM[0], TO[1] - FROM[1]);
    ((p[0] - FROM[0]) * dy - (p[1] - FROM[1]) * dx).abs() / dx.hypot(dy)
}

#[test]
fn a_calibrated_source_reports_the_true_ground_speed_and_places_on_the_path() {
    let seen = run_clip(true);
    let truth = SPEED_MS * 3.6;
    assert!(!seen.is_empty(), "the walker was never tracked");
    assert!(
        seen.iter().all(|s| s.px_s.is_none()),
        "px/s on a calibrated source"
    );
    for s in &seen {
        let g = s.ground.unwrap_or_else(|| panic!("no ground place: {s:?}"));
        assert!(
            off_path(g) < PATH_TOLERANCE_M,
            "{:.3} m off the path: {s:?}",
            off_path(g)
        );
    }
    let first = seen
        .iter()
        .find(|s| s.kmh.is_some())
        .expect("no speed ever");
    let settled: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.frame.saturating_sub(first.frame) as f64 >= WINDOW_S * f64::from(FPS))
        .collect();
    assert!(
        settled.len() > 20,
        "too few settled speeds: {}",
        settled.len()
    );
    for s in &settled {
        let v = s
            .kmh
            .unwrap_or_else(|| panic!("a settled track without speed: {s:?}"));
        assert!(
            (v - truth).abs() <= truth * SPEED_TOLERANCE,
            "{v} km/h, truth {truth}: {s:?}"
        );
    }
    for s in &seen {
        if let Some(v) = s.kmh {
            assert!(
                v <= truth * (1.0 + SPEED_TOLERANCE),
                "{v} km/h above {truth}: {s:?}"
            );
        }
    }
}

#[test]
fn without_a_calibration_the_same_clip_reports_pixels_a_second_only() {
    let seen = run_clip(false);
    assert!(seen.iter().any(|s| s.px_s.is_some()), "no speed in px/s");
    assert!(
        seen.iter().all(|s| s.kmh.is_none() && s.ground.is_none()),
        "{seen:?}"
    );
}
