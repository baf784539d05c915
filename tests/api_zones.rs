//! `/api/counts/zones` and `/api/heatmap` on a real `vidflow` over a real clip (PETS09-S2L1,
//! people walking, followed by `motion` and the tracker, counted in a zone), checked against
//! what a JSONL sink wrote for the same frames: the heatmap's seconds are the seen tracks'
//! object-seconds, each frame counting for its time step (within a frame's time), the zone's
//! enters and leaves its events, its occupancy the time-weighted mean and the most of its
//! counts; the PNG is the size of the still it is drawn over. A live second source keeps the
//! run (and its API) up once the clip has ended.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::time::Duration;

use common::{free_port, repo_root, spawn_run, write};
use http_client::{get, open, wait_until};
use opencv::core::{Mat, MatTraitConst};
use opencv::imgcodecs;

/// Frames of assets/vtest.avi.
const CLIP_FRAMES: usize = 795;
/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(300);

fn pipeline(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let clip = repo_root().join("assets/vtest.avi");
    write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.street]
uri = "{}"

[sources.lobby]
uri = "test://smpte?width=320&height=240&fps=2&live=true"

[steps.moving]
kind = "motion"
image = "$frame"
class = "person"
min_area = 400.0

[steps.tracks]
kind = "tracker"
detections = "$steps.moving.detections"

[steps.zones]
kind = "zone_count"
tracks = "$steps.tracks.tracks"
zones = {{ left = [[0, 0], [384, 0], [384, 576], [0, 576]] }}

[http]
listen = "127.0.0.1:{port}"

[events]
path = "events.db"

[sinks.frames]
kind = "jsonl"
path = "frames.jsonl"
include = ["$steps.tracks.tracks", "$steps.zones.counts", "$steps.zones.events"]

[sinks.preview]
kind = "preview"
image = "$frame"
"#,
            clip.display()
        ),
    )
}

/// The street's frames as the JSONL sink wrote them, in frame order.
fn street_frames(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("frames.jsonl")).unwrap_or_default();
    let mut frames: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|f: &serde_json::Value| f["source"] == "street")
        .collect();
    frames.sort_by_key(|f| f["frame"].as_u64().unwrap());
    frames
}

fn json(port: u16, target: &str) -> serde_json::Value {
    let (status, body) = get(port, target).unwrap();
    assert_eq!(status, 200, "{target}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn png_size(port: u16, target: &str) -> (i32, i32, f64) {
    let (status, headers, mut body) = open(port, target).unwrap();
    assert_eq!(status, 200, "{target}: {headers:?}");
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut body, &mut bytes).unwrap();
    let img =
        imgcodecs::imdecode(&Mat::from_slice(&bytes).unwrap(), imgcodecs::IMREAD_COLOR).unwrap();
    assert!(
        !img.empty(),
        "{target}: not a picture ({} bytes)",
        bytes.len()
    );
    let mean = opencv::core::mean_def(&img).unwrap();
    (img.cols(), img.rows(), mean[0] + mean[1] + mean[2])
}

#[test]
fn zone_visits_occupancy_and_the_heatmap_add_up_to_what_the_tracks_did() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let run = spawn_run(&pipeline(dir.path(), port), &[], dir.path());
    // The clip ends (the live lobby keeps the run up), and its frames are all written.
    wait_until("the street to end", DEADLINE, || {
        let (status, body) = get(port, "/api/sources")?;
        let list: serde_json::Value = serde_json::from_str(&body).ok()?;
        let street = list.as_array()?.iter().find(|s| s["name"] == "street")?;
        (status == 200 && street["state"] == "ended").then_some(())
    });
    let frames = wait_until("the street's frames in the JSONL", DEADLINE, || {
        let frames = street_frames(dir.path());
        (frames.len() == CLIP_FRAMES).then_some(frames)
    });
    // What the store must hold: each frame counts for its time step (since the frame before;
    // the first, a frame's time).
    let pts: Vec<f64> = frames
        .iter()
        .map(|f| f["pts_ms"].as_f64().unwrap() / 1000.0)
        .collect();
    let interval = pts[1] - pts[0];
    let dt = |i: usize| {
        if i == 0 {
            interval
        } else {
            pts[i] - pts[i - 1]
        }
    };
    let (mut seen_s, mut inside_s, mut seconds, mut most) = (0.0, 0.0, 0.0, 0);
    let (mut enters, mut leaves) = (0, 0);
    for (i, f) in frames.iter().enumerate() {
        let seen = f["steps.tracks.tracks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["predicted"] != true);
        seen_s += seen.count() as f64 * dt(i);
        let n = f["steps.zones.counts"]["left"].as_u64().unwrap();
        inside_s += n as f64 * dt(i);
        seconds += dt(i);
        most = most.max(n);
        for e in f["steps.zones.events"].as_array().unwrap() {
            match e["event"].as_str().unwrap() {
                "enter" => enters += 1,
                "leave" => leaves += 1,
                _ => {}
            }
        }
    }
    assert!(
        seen_s > 10.0 && enters > 0,
        "a clip with people: {seen_s} s, {enters} enters"
    );
    // The writer is a batch behind the sink at most (its total only grows).
    let map = wait_until("the heatmap of every frame", DEADLINE, || {
        let map = json(port, "/api/heatmap?source=street");
        (map["total_s"].as_f64()? >= seen_s - interval).then_some(map)
    });
    let total = map["total_s"].as_f64().unwrap();
    assert!(
        (total - seen_s).abs() <= interval,
        "heatmap {total} s, tracks {seen_s} s"
    );
    let cells: f64 = map["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .sum();
    assert!(
        (cells - seen_s).abs() <= interval,
        "cells {cells} s, tracks {seen_s} s"
    );
    assert_eq!(
        (map["cols"].as_u64(), map["rows"].as_u64()),
        (Some(32), Some(24))
    );
    assert_eq!(
        (map["width"].as_i64(), map["height"].as_i64()),
        (Some(768), Some(576))
    );
    let by_label = json(port, "/api/heatmap?source=street&label=person");
    assert_eq!(by_label["total_s"], map["total_s"]);

    let zones = json(port, "/api/counts/zones?source=street&bucket=day");
    let rows = zones["zones"].as_array().unwrap();
    let sum = |key: &str| rows.iter().map(|r| r[key].as_i64().unwrap()).sum::<i64>();
    assert_eq!((sum("enters"), sum("leaves")), (enters, leaves), "{zones}");
    assert!(
        rows.iter()
            .all(|r| r["place"] == "left" && r["step"] == "zones"),
        "{zones}"
    );
    let max = rows
        .iter()
        .map(|r| r["occupancy"]["max"].as_u64().unwrap())
        .max();
    assert_eq!(max, Some(most), "{zones}");
    if let [one] = rows.as_slice() {
        let mean = one["occupancy"]["mean"].as_f64().unwrap();
        assert!(
            (mean - inside_s / seconds).abs() < 1e-3,
            "{mean} vs {}",
            inside_s / seconds
        );
    }

    // Over the clip's frames' size (its still, or black once it ended unwatched), and over the
    // live lobby's still (its colour bars: not black).
    let (w, h, _) = png_size(port, "/api/heatmap?source=street&format=png");
    assert_eq!((w, h), (768, 576));
    let (w, h, colour) = png_size(port, "/api/heatmap?source=lobby&format=png");
    assert_eq!((w, h), (320, 240));
    assert!(colour > 30.0, "drawn over the lobby's still: mean {colour}");
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
