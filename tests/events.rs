//! The event store's links on a real `vidflow` run (a moving ball followed by `motion` and the
//! tracker, counted across a line, read as fast as it decodes): each crossing's snapshot and
//! clip are those that the sinks triggered by its line made for its frame, never the files of
//! another sink on the same source (a snapshot of every frame, clips of every motion) that were
//! written as close to it in time; and rows are at the frames' times, not the writing times.
//! Clips of both modes: encoded from the images, and the source's own packets (of a file).
//! Of two balls crossing on the same frames, each crossing gets the crop of its own ball.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{BALL_CROSSINGS, jsonl, run_to_eos, spawn_run, write};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(180);
/// Frames of the ball: 20 s of the scene at 15 fps, 10 s at 30.
const FRAMES: u64 = 300;

#[test]
fn a_crossing_gets_the_snapshot_and_clip_its_line_made_for_its_frame_never_another_sinks() {
    let uri = format!("test://ball?width=320&height=240&fps=15&frames={FRAMES}&live=false");
    crossings_get_their_own_files(&uri, 15, "encode");
}

#[test]
fn a_crossing_gets_the_packet_clip_its_line_made_for_its_frame() {
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("ball.mp4");
    // A keyframe every half second, as a camera sends: each crossing's clip can start within
    // its pre-roll.
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers={FRAMES} ! \
         video/x-raw,width=320,height=240,framerate=30/1 ! videoconvert ! \
         video/x-raw,format=I420 ! x264enc speed-preset=ultrafast key-int-max=15 bframes=0 ! \
         h264parse ! mp4mux ! filesink location={}",
        video.display()
    ));
    crossings_get_their_own_files(&format!("file://{}", video.display()), 30, "packets");
}

/// Runs the pipeline on `uri` (`fps` frames a second) with its crossings' clips in `mode`, and
/// checks every crossing's row.
fn crossings_get_their_own_files(uri: &str, fps: i64, mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{uri}"

{BALL_CROSSINGS}

[events]
path = "events.db"

[sinks.log]
kind = "jsonl"
path = "frames.jsonl"
include = ["$steps.crossing.events"]

[sinks.crossings]
kind = "snapshot"
image = "$frame"
when = ["$steps.crossing.events"]
dir = "crossings"
cooldown_s = 0.0

[sinks.every]
kind = "snapshot"
image = "$frame"
dir = "every"
cooldown_s = 0.0

[sinks.clips]
kind = "clip"
image = "$frame"
when = ["$steps.crossing.events"]
dir = "clips"
mode = "{mode}"
pre_roll_s = 1.0
post_roll_s = 1.0

[sinks.motion_clips]
kind = "clip"
image = "$frame"
when = ["$steps.moving.detections"]
dir = "motion_clips"
pre_roll_s = 1.0
post_roll_s = 1.0
"#
        ),
    );
    let out = spawn_run(&p, &[], dir.path()).finish(DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);

    // Each crossing's frame, by its track and direction, from the raw record.
    let mut frames: HashMap<(i64, String), Vec<u64>> = HashMap::new();
    for line in jsonl(&dir.path().join("frames.jsonl")) {
        let frame = line["frame"].as_u64().unwrap();
        for e in line["steps.crossing.events"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = (
                e["track_id"].as_i64().unwrap(),
                e["event"].as_str().unwrap().to_owned(),
            );
            frames.entry(key).or_default().push(frame);
        }
    }
    assert!(!frames.is_empty(), "the ball crosses the line");

    let conn = rusqlite::Connection::open(dir.path().join("events.db")).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT track_id, direction, start_ms, snapshot, clip FROM events
             WHERE kind = 'crossing' ORDER BY id",
        )
        .unwrap();
    type Row = (i64, String, i64, Option<String>, Option<String>);
    let rows: Vec<Row> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        rows.len(),
        frames.values().map(Vec::len).sum::<usize>(),
        "{rows:?}"
    );
    let first_start = rows[0].2;
    let mut seen: HashMap<(i64, String), usize> = HashMap::new();
    for (track, direction, start, snapshot, clip) in &rows {
        let key = (*track, direction.clone());
        let n = seen.entry(key.clone()).or_default();
        let frame = frames[&key][*n];
        *n += 1;
        let snapshot = snapshot
            .as_deref()
            .unwrap_or_else(|| panic!("no snapshot: {rows:?}"));
        assert!(
            snapshot.starts_with("crossings/") && snapshot.contains(&format!("cam-{frame:06}-")),
            "crossing of track {track} at frame {frame} got {snapshot}"
        );
        let clip = clip
            .as_deref()
            .unwrap_or_else(|| panic!("no clip: {rows:?}"));
        assert!(
            clip.starts_with("clips/"),
            "crossing at frame {frame} got {clip}"
        );
        // Frame time: `fps` from the first crossing's frame, however fast the file was read.
        let (_, first_direction, ..) = &rows[0];
        let first_frame = frames[&(rows[0].0, first_direction.clone())][0];
        let expected = (frame - first_frame) as i64 * 1000 / fps;
        assert!(
            (start - first_start - expected).abs() <= 1,
            "crossing at frame {frame}: {} ms after the first, not {expected}",
            start - first_start
        );
    }
}

/// A red ball on the left half and a green one on the right, moving alike: they cross a line
/// across the picture on the same frames. The snapshot sink makes a crop of each ball on those
/// frames; each crossing gets the crop of its own ball, never the other one's (files were
/// once linked by frame alone, so both crossings of a frame got the same crop).
#[test]
fn two_crossings_on_one_frame_each_get_the_crop_of_their_own_ball() {
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("balls.mp4");
    let ball = |colour: &str, pad: u32| {
        format!(
            "videotestsrc pattern=ball foreground-color={colour} num-buffers={FRAMES} ! \
             video/x-raw,width=160,height=240,framerate=15/1 ! m.sink_{pad} "
        )
    };
    run_to_eos(&format!(
        "compositor name=m sink_1::xpos=160 ! video/x-raw,width=320,height=240 ! videoconvert ! \
         video/x-raw,format=I420 ! x264enc speed-preset=ultrafast key-int-max=15 bframes=0 ! \
         h264parse ! mp4mux ! filesink location={} {} {}",
        video.display(),
        ball("0xffff0000", 0),
        ball("0xff00ff00", 1),
    ));
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "file://{}"

[steps.moving]
kind = "motion"
image = "$frame"
class = "ball"
min_area = 50.0

[steps.tracks]
kind = "tracker"
detections = "$steps.moving.detections"

[steps.crossing]
kind = "line_counter"
tracks = "$steps.tracks.tracks"
line = [[0, 120], [320, 120]]
name = "across"

[events]
path = "events.db"

[sinks.log]
kind = "jsonl"
path = "frames.jsonl"
include = ["$steps.crossing.events"]

[sinks.balls]
kind = "snapshot"
image = "$frame"
when = ["$steps.crossing.events"]
crops = "$steps.moving.detections"
padding = 0.0
dir = "balls"
cooldown_s = 0.0
"#,
            video.display()
        ),
    );
    let out = spawn_run(&p, &[], dir.path()).finish(DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);

    let together = jsonl(&dir.path().join("frames.jsonl"))
        .iter()
        .filter(|l| {
            l["steps.crossing.events"]
                .as_array()
                .is_some_and(|e| e.len() == 2)
        })
        .count();
    assert!(together > 0, "the balls cross on the same frames");

    let conn = rusqlite::Connection::open(dir.path().join("events.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT track_id, box, snapshot FROM events WHERE kind = 'crossing'")
        .unwrap();
    let rows: Vec<(i64, String, Option<String>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(rows.len() >= 2 * together, "{rows:?}");
    for (track, bbox, snapshot) in &rows {
        let bbox: Vec<f64> = serde_json::from_str(bbox).unwrap();
        let left = bbox[0] + bbox[2] / 2.0 < 160.0;
        let snapshot = snapshot
            .as_deref()
            .unwrap_or_else(|| panic!("track {track} got no crop: {rows:?}"));
        let crop =
            opencv::imgcodecs::imread(dir.path().join(snapshot), opencv::imgcodecs::IMREAD_COLOR)
                .unwrap();
        // BGR: the red ball's crop is mostly red, the green one's mostly green.
        let mean = opencv::core::mean_def(&crop).unwrap();
        let red = mean[2] > mean[1];
        assert_eq!(
            red,
            left,
            "track {track} at {bbox:?} (the {} ball) got {snapshot}, of the {} ball",
            if left { "red" } else { "green" },
            if red { "red" } else { "green" },
        );
    }
}
