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

use crate::common;

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

/// (kind, step, track ID) of a row of the event store.
type Row = (String, String, Option<i64>);

/// Runs the standard clip through motion -> tracker -> zone_count and line_counter; gives the
/// scene, the JSON line of every frame and the event store's rows.
fn count_clip() -> (Scene, Vec<Json>, Vec<Row>) {
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

[events]
path = "events.db"

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
# Loitering in "parking" is more than 1.05 s inside (frames are 0.1 s apart).
zones = {{ parking = {{ points = [[119, 170], [200, 170], [200, 230], [119, 230]], loiter_s = 1.05 }}, top_right = [[231, 40], [286, 40], [286, 90], [231, 90]] }}

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
           "$steps.zones.tracks", "$steps.door.counts", "$steps.door.events"]
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
    let conn = rusqlite::Connection::open(dir.path().join("events.db")).unwrap();
    let mut rows = conn
        .prepare("SELECT kind, step, track_id FROM events")
        .unwrap();
    let rows = rows
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (scene, lines, rows)
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
    let (scene, lines, rows) = count_clip();

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
        (65, "loiter", "parking", "stops"),
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

    // The time inside, in frame time: east was in top_right from frame 76 to 85, the last
    // frame it was seen there; stops loitered 1.1 s in (more than 1.05), and left parking
    // from where the tracker last saw it.
    let dwell = |event: &str, place: &str| -> f64 {
        let (f, e) = lines
            .iter()
            .enumerate()
            .flat_map(|(f, l)| {
                let events = l["steps.zones.events"].as_array().unwrap();
                events.iter().map(move |e| (f, e))
            })
            .find(|(_, e)| e["event"] == event && e["place"] == place)
            .unwrap_or_else(|| panic!("no {event} of {place}"));
        assert!(
            place != "parking" || e["track_id"] == stops_id,
            "frame {f}: {e}"
        );
        e["dwell_s"].as_f64().unwrap()
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-3;
    assert!(
        close(dwell("leave", "top_right"), 0.9),
        "{}",
        dwell("leave", "top_right")
    );
    assert!(
        close(dwell("loiter", "parking"), 1.1),
        "{}",
        dwell("loiter", "parking")
    );
    let seen_last = (54..stops_gone)
        .rev()
        .find(|&f| {
            let tracks = lines[f as usize]["steps.follow.tracks"].as_array().unwrap();
            tracks
                .iter()
                .any(|t| t["track_id"].as_u64() == Some(stops_id) && t["predicted"].is_null())
        })
        .unwrap();
    let stayed = f64::from(seen_last - 54) / 10.0;
    assert!(
        close(dwell("leave", "parking"), stayed),
        "{} {stayed}",
        dwell("leave", "parking")
    );
    // zone_count's tracks: the tracker's, with their time in the zones they are in now.
    for f in [75, 76, 80, 85, 86] {
        let zoned = lines[f]["steps.zones.tracks"].as_array().unwrap();
        let follow = lines[f]["steps.follow.tracks"].as_array().unwrap();
        assert_eq!(zoned.len(), follow.len(), "frame {f}");
        let visible = scene.visible(east, f as u32).unwrap();
        let east = zoned
            .iter()
            .find(|t| visible.iou(&bbox(&t["box"])) >= SAME_OBJECT_IOU)
            .unwrap_or_else(|| panic!("frame {f}: east not in {zoned:?}"));
        let want = (76..86).contains(&f).then(|| (f - 76) as f64 / 10.0);
        let got = east["dwell_s"]["top_right"].as_f64();
        assert!(
            got.zip(want).map_or(got == want, |(g, w)| close(g, w)),
            "frame {f}: {east}"
        );
    }
    // The store has the tracker's track rows only, never zone_count's copy of them.
    let track_rows = |step: &str| {
        rows.iter()
            .filter(|r| r.0 == "track" && r.1 == step)
            .count()
    };
    assert!(track_rows("follow") >= 3, "{rows:?}");
    assert_eq!(track_rows("zones"), 0, "{rows:?}");
    assert!(
        rows.iter()
            .any(|r| r.0 == "loiter" && r.2 == Some(stops_id as i64)),
        "{rows:?}"
    );
}
