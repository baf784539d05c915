//! The `clip` sink on the real `vidflow` binary and real encoded video: a still scene with two
//! bursts of movement gives one clip per burst, each from `pre_roll_s` before its first trigger
//! to `post_roll_s` after its last (measured by decoding the clips), listed in `clips.jsonl`;
//! a second run keeps the first run's clips. In packets mode the clips are the file's own
//! H.264 stream, copied: their frames decode to the file's bit for bit, from a keyframe.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::shapes::{Form, Mover, Scene};
use common::*;

/// Only a guard against a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(180);
const FPS: u64 = 10;
const PRE_ROLL_FRAMES: u64 = 20;
const POST_ROLL_FRAMES: u64 = 20;
/// Keyframe interval: a clip starts at most this much earlier than its pre-roll asks.
const KEYFRAME_FRAMES: u64 = 5;
/// The camera's keyframe interval, in the packet mode's test.
const CAMERA_KEYFRAME_FRAMES: u64 = 15;

/// 20 s at 10 fps: a square stands still but for two bursts, frames 60..70 and 150..160.
fn scene() -> Scene {
    let (y, a, b, c) = (100.0, 40.0, 140.0, 240.0);
    Scene {
        width: 320,
        height: 240,
        fps: FPS as i32,
        frames: 200,
        background: [96, 96, 96],
        movers: vec![Mover {
            name: "bursts",
            form: Form::Rect,
            colour: [40, 40, 220],
            width: 40,
            height: 40,
            path: vec![
                (0, a, y),
                (60, a, y),
                (70, b, y),
                (150, b, y),
                (160, c, y),
                (199, c, y),
            ],
        }],
        occluders: Vec::new(),
    }
}

/// The clip sink's keys of the encode mode.
fn encode_keys() -> String {
    format!("keyframe_s = {}", KEYFRAME_FRAMES as f64 / FPS as f64)
}

/// Motion on `clip`'s frames triggers a `clip` sink with `keys` added.
fn pipeline(dir: &Path, clip: &Path, keys: &str) -> std::path::PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "file://{}"

[executor]
workers = 1
max_in_flight = 1

[steps.motion]
kind = "motion"
image = "$frame"

[steps.moving]
kind = "filter"
detections = "$steps.motion.detections"
min_area = 400.0

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.moving.detections"]

[sinks.clips]
kind = "clip"
dir = "out/clips"
image = "$frame"
when = "$steps.moving.detections"
pre_roll_s = {}
post_roll_s = {}
{keys}
"#,
            clip.display(),
            PRE_ROLL_FRAMES as f64 / FPS as f64,
            POST_ROLL_FRAMES as f64 / FPS as f64,
        ),
    )
}

/// The events the triggers make, as `(first trigger, last trigger)` frames: a trigger more than
/// the post-roll after the previous one starts a new event.
fn events(lines: &[serde_json::Value]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for line in lines {
        if line["steps.moving.detections"]
            .as_array()
            .unwrap()
            .is_empty()
        {
            continue;
        }
        let frame = line["frame"].as_u64().unwrap();
        match out.last_mut() {
            Some((_, last)) if frame - *last <= POST_ROLL_FRAMES => *last = frame,
            _ => out.push((frame, frame)),
        }
    }
    out
}

#[test]
fn each_event_gives_one_clip_with_its_pre_roll_and_post_roll() {
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("bursts.mp4");
    scene().write_mp4(&video);
    let p = pipeline(dir.path(), &video, &encode_keys());
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);

    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 200);
    let events = events(&lines);
    // The two bursts, and no trigger from the still frames before them. (Background
    // subtraction keeps seeing a moved square for a while after it stops: events end later.)
    assert_eq!(events.len(), 2, "{events:?}");
    assert!((60..=62).contains(&events[0].0), "{events:?}");
    assert!((150..=152).contains(&events[1].0), "{events:?}");

    let clips_dir = dir.path().join("out/clips");
    let index = jsonl(&clips_dir.join("clips.jsonl"));
    assert_eq!(index.len(), events.len(), "{index:?}");
    for ((first_trigger, last_trigger), clip) in events.iter().zip(&index) {
        let first = clip["first_frame"].as_u64().unwrap();
        let frames = clip["frames"].as_u64().unwrap();
        let last = first + frames - 1;
        // From a keyframe at least the pre-roll before the first trigger, and no more than one
        // keyframe interval earlier.
        assert!(
            first + PRE_ROLL_FRAMES <= *first_trigger,
            "{clip} {first_trigger}"
        );
        assert!(
            first + PRE_ROLL_FRAMES + KEYFRAME_FRAMES >= *first_trigger,
            "{clip} starts too early for {first_trigger}"
        );
        // Up to the post-roll after the last trigger, or the end of the video.
        assert_eq!(last, (last_trigger + POST_ROLL_FRAMES).min(199), "{clip}");
        let path = clips_dir.join(clip["path"].as_str().unwrap());
        assert_eq!(count_video_frames(&path), frames, "{}", path.display());
        let duration = clip["duration_s"].as_f64().unwrap();
        assert!(
            (duration - frames as f64 / FPS as f64).abs() < 0.01,
            "{clip}"
        );
    }

    // A second run names its clips apart and keeps the first run's files.
    let first_run: Vec<(String, Vec<u8>)> = index
        .iter()
        .map(|c| {
            let name = c["path"].as_str().unwrap().to_owned();
            let bytes = std::fs::read(clips_dir.join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let index = jsonl(&clips_dir.join("clips.jsonl"));
    assert_eq!(index.len(), 2 * events.len(), "{index:?}");
    for (name, bytes) in first_run {
        assert_eq!(
            std::fs::read(clips_dir.join(&name)).unwrap(),
            bytes,
            "{name}"
        );
        assert!(
            index[events.len()..]
                .iter()
                .all(|c| c["path"].as_str().unwrap() != name),
            "{name} reused"
        );
    }
}

/// The camera's own packets: the scene encoded as a camera does (a keyframe every
/// [`CAMERA_KEYFRAME_FRAMES`]), its clips cut from that stream, never encoded again: each
/// clip's frames decode to the file's own, bit for bit, from a keyframe at least the pre-roll
/// before the event's first trigger to the post-roll after its last.
#[test]
fn a_packet_clip_is_the_cameras_own_frames_from_the_keyframe_before_its_pre_roll() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("bursts-raw.mp4");
    // A dot too small to trigger, moving on every frame: no two frames alike, so each of a
    // clip's frames is found at one place in the file.
    let mut scene = scene();
    scene.movers.push(Mover {
        name: "ticks",
        form: Form::Rect,
        colour: [220, 220, 220],
        width: 4,
        height: 4,
        path: vec![(0, 4.0, 220.0), (199, 304.0, 220.0)],
    });
    scene.write_mp4(&raw);
    let video = dir.path().join("bursts.mp4");
    run_to_eos(&format!(
        "filesrc location={} ! decodebin ! videoconvert ! video/x-raw,format=I420 ! \
         x264enc speed-preset=ultrafast key-int-max={CAMERA_KEYFRAME_FRAMES} bframes=0 ! \
         h264parse ! mp4mux ! filesink location={}",
        raw.display(),
        video.display()
    ));
    let reference = frame_hashes(&video);
    assert_eq!(reference.len(), 200);
    let unique: std::collections::HashSet<&[u8; 32]> = reference.iter().collect();
    assert_eq!(unique.len(), reference.len(), "frames alike");
    let p = pipeline(dir.path(), &video, "mode = \"packets\"");
    let out = spawn_run(&p, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);

    let events = events(&jsonl(&dir.path().join("out/events.jsonl")));
    assert_eq!(events.len(), 2, "{events:?}");
    let clips_dir = dir.path().join("out/clips");
    let index = jsonl(&clips_dir.join("clips.jsonl"));
    assert_eq!(index.len(), events.len(), "{index:?}\n{}", out.stderr);
    for ((first_trigger, last_trigger), clip) in events.iter().zip(&index) {
        let got = frame_hashes(&clips_dir.join(clip["path"].as_str().unwrap()));
        assert_eq!(clip["frames"].as_u64(), Some(got.len() as u64), "{clip}");
        // Where the clip's first frame is in the file (one place): its frames are the
        // file's from there.
        let first = reference
            .iter()
            .position(|h| *h == got[0])
            .unwrap_or_else(|| panic!("{clip}: its first frame is none of the file's"));
        let last = first + got.len() - 1;
        assert_eq!(
            got[..],
            reference[first..=last],
            "{clip}: not the file's frames"
        );
        let first = first as u64;
        assert_eq!(
            first % CAMERA_KEYFRAME_FRAMES,
            0,
            "{clip}: starts at {first}"
        );
        assert!(
            first + PRE_ROLL_FRAMES <= *first_trigger,
            "{clip} starts at {first}, after the pre-roll of {first_trigger}"
        );
        assert!(
            first + PRE_ROLL_FRAMES + CAMERA_KEYFRAME_FRAMES > *first_trigger,
            "{clip} starts at {first}: not the keyframe before the pre-roll of {first_trigger}"
        );
        assert!(
            last as u64 >= (last_trigger + POST_ROLL_FRAMES).min(199),
            "{clip} ends at {last}, before the post-roll of {last_trigger}"
        );
    }
}
