//! Zone and line counting end to end: the synthetic clip of `common::shapes` (shapes on known
//! paths, real H.264), decoded by the real `vidflow` binary, detected (`motion`), tracked
//! (`tracker`), counted (`zone_count`, `line_counter`) and written as JSON lines.
//!
//! Where the zones and the line are: every edge is placed halfway between the anchor's
//! positions on two consecutive frames (the shapes move 5.5 to 5.7 pixels a frame), so that
//! the one- or two-pixel margin of `motion`'s boxes (its mask is dilated) cannot move an event
//! to another frame; the line's `dead_band` is 1 pixel for the same reason (its default, 3,
//! is more than half a step). The tracker confirms a track `min_hits` (3) detections after
//! `motion` first reports it, around frame 35 (shapes enter at frame 30 and `min_area` waits
//! until about two thirds are in view); every edge is crossed after frame 50, so that delay
//! moves no event. The one event not fixed by the paths is the leave of a track that ends
//! inside a zone: `stops` stands still from frame 60, `motion` learns it into the background
//! and reports it no more, and the tracker drops it `max_age` frames later; that frame is
//! read from the tracker's own output, and `zone_count` has it leave `reid_frames` after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::shapes::Scene;
use common::*;
use serde_json::Value as Json;
use vidflow::value::BBox;

/// Only a guard against a hang: 100 small frames through `motion` in a debug build.
const RUN_DEADLINE: Duration = Duration::from_secs(120);
/// A reported box is a shape's when it overlaps the visible part of it this much.
const SAME_OBJECT_IOU: f32 = 0.5;

/// `zone_count`'s default `reid_frames`: how long a lost track stays inside its zones.
const REID_FRAMES: u32 = 30;

/// Runs the standard clip through motion -> tracker -> zone_count and line_counter; gives the
/// scene and the JSON line of every frame.
fn count_clip() -> (Scene, Vec<Json>) {
    let scene = Scene::standard();
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("shapes.mp4");
    scene.write_mp4(&clip);
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.clip]
uri = "{}"

[executor]
workers = 2

[steps.moving]
kind = "motion"
image = "$frame"
min_area = 900.0

[steps.follow]
kind = "tracker"
detections = "$steps.moving.detections"
max_age = 10

# "parking": where `stops` comes to rest (its anchor, the bottom centre, is at y 212).
# "top_right": on `east`'s lane, past the pillar (anchor y 66).
[steps.zones]
kind = "zone_count"
tracks = "$steps.follow.tracks"
zones = {{ parking = [[119, 170], [200, 170], [200, 230], [119, 230]], top_right = [[231, 40], [286, 40], [286, 90], [231, 90]] }}

# Drawn downwards: its right-hand side (on the image) is x < 99.5, so "in" is moving left.
# It spans the top and middle lanes; `stops`, in the bottom lane, passes its extension.
[steps.door]
kind = "line_counter"
tracks = "$steps.follow.tracks"
line = [[99.5, 20], [99.5, 160]]
name = "door"
dead_band = 1.0

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.follow.tracks", "$steps.zones.counts", "$steps.zones.events",
           "$steps.door.counts", "$steps.door.events"]
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&pipeline, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    assert_eq!(lines.len(), scene.frames as usize);
    for (f, line) in lines.iter().enumerate() {
        assert_eq!(line["frame"].as_u64(), Some(f as u64));
    }
    (scene, lines)
}

fn bbox(json: &Json) -> BBox {
    let v = |k: &str| json[k].as_f64().unwrap() as f32;
    BBox {
        x: v("x"),
        y: v("y"),
        width: v("width"),
        height: v("height"),
    }
}

/// The name of the mover whose visible part `b` is at `frame`.
fn whose(scene: &Scene, frame: u32, b: &BBox) -> &'static str {
    let i = (0..scene.movers.len())
        .find(|&i| {
            scene
                .visible(i, frame)
                .is_some_and(|v| v.iou(b) >= SAME_OBJECT_IOU)
        })
        .unwrap_or_else(|| panic!("frame {frame}: box {b:?} is on no shape"));
    scene.movers[i].name
}

/// Every event of `key` as (frame, event, place, mover, track ID), in frame order.
fn events(scene: &Scene, lines: &[Json], key: &str) -> Vec<(u32, String, String, String, u64)> {
    let mut all = Vec::new();
    for (f, line) in lines.iter().enumerate() {
        let f = f as u32;
        for e in line[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {line}"))
        {
            all.push((
                f,
                e["event"].as_str().unwrap().to_owned(),
                e["place"].as_str().unwrap().to_owned(),
                whose(scene, f, &bbox(&e["box"])).to_owned(),
                e["track_id"].as_u64().unwrap(),
            ));
        }
    }
    all
}

/// The first frame after `from` on which track `id` is no longer reported.
fn gone_after(lines: &[Json], id: u64, from: u32) -> Option<u32> {
    (from..lines.len() as u32).find(|&f| {
        let tracks = lines[f as usize]["steps.follow.tracks"].as_array().unwrap();
        !tracks.iter().any(|t| t["track_id"].as_u64() == Some(id))
    })
}

/// (frame, event, place, mover) of each event, without the track ID.
fn said(all: &[(u32, String, String, String, u64)]) -> Vec<(u32, &str, &str, &str)> {
    all.iter()
        .map(|(f, e, p, m, _)| (*f, e.as_str(), p.as_str(), m.as_str()))
        .collect()
}

#[test]
fn zones_and_a_line_count_the_shapes_exactly_at_the_frames_of_their_paths() {
    let (scene, lines) = count_clip();

    // The line: east crosses it leftwards-to-rightwards ("out") between frames 51 (centre
    // x 97) and 52 (102); west the other way ("in") between 73 (102) and 74 (97). The
    // paths agree:
    let [east, west, stops] = ["east", "west", "stops"].map(|n| scene.mover(n));
    assert_eq!(scene.crosses_x(east, 99.5), Some(52));
    assert_eq!(scene.crosses_x(west, 99.5), Some(74));
    assert!(
        scene.crosses_x(stops, 99.5).is_some(),
        "stops passes the extension"
    );
    let door = events(&scene, &lines, "steps.door.events");
    assert_eq!(
        said(&door),
        vec![(52, "out", "door", "east"), (74, "in", "door", "west")]
    );
    for (f, line) in lines.iter().enumerate() {
        let (ins, outs) = match f {
            0..52 => (0, 0),
            52..74 => (0, 1),
            _ => (1, 1),
        };
        assert_eq!(
            line["steps.door.counts"],
            serde_json::json!({"in": ins, "out": outs}),
            "frame {f}"
        );
    }

    // The zones: stops' anchor passes x 119 between frames 53 (116) and 54 (122) and rests
    // at x 156; east's passes x 231 between 75 (228) and 76 (234), and x 286 between 85
    // (283) and 86 (289).
    let zones = events(&scene, &lines, "steps.zones.events");
    let (_, _, _, _, stops_id) = zones
        .iter()
        .find(|e| e.3 == "stops")
        .unwrap_or_else(|| panic!("no event of stops: {zones:?}"))
        .clone();
    let stops_gone = gone_after(&lines, stops_id, 54)
        .unwrap_or_else(|| panic!("stops' track {stops_id} never ended"));
    assert!(
        stops_gone > 60,
        "stops' track ended at {stops_gone}, still moving"
    );
    // Stops rests in parking until its track ends (motion sees nothing still); zone_count
    // remembers a lost track inside its zones for reid_frames, in case the tracker only missed
    // it, so it leaves that many frames after.
    let stops_left = stops_gone + REID_FRAMES;
    let mut want = vec![
        (54, "enter", "parking", "stops"),
        (76, "enter", "top_right", "east"),
        (86, "leave", "top_right", "east"),
        (stops_left, "leave", "parking", "stops"),
    ];
    want.sort();
    assert_eq!(said(&zones), want);
    for (f, line) in lines.iter().enumerate() {
        let f = f as u32;
        let parking = u64::from((54..stops_left).contains(&f));
        let top_right = u64::from((76..86).contains(&f));
        assert_eq!(
            line["steps.zones.counts"],
            serde_json::json!({"parking": parking, "top_right": top_right}),
            "frame {f}"
        );
    }
}
