//! Tracking on a clip made at test time (`common::shapes`): plain shapes on known paths, real
//! H.264, decoded by the real `vidflow` binary, found by a real detector and tracked.
//!
//! The detector is the `motion` step (MOG2 background subtraction): on a still background it
//! finds every moving shape on every frame, whatever its form or colour, with no model to
//! fetch; a cascade or a network trained on people or faces would not fire on plain shapes.
//! Two limits of it shape these tests. It reports the visible part of an object, so a shape
//! half behind the pillar is a box half as wide whose centre moves at half the speed; its
//! `min_area` is set to keep only shapes at least about two thirds in view (900 of 1296
//! square pixels), as a trained detector reports an object only when enough of it shows. And a
//! shape that stops is learnt into the background after a few frames and found no more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::shapes::Scene;
use common::*;
use gstreamer as gst;
use gstreamer::prelude::*;
use opencv::core::{Mat, MatTraitConst};
use vidflow::value::BBox;

/// A decoded pixel this far from the drawn one (in levels of 255, any channel) is wrong: the
/// I420 round trip moves flat colours by 2 or 3 levels, more only where chroma is shared by
/// a shape's edge and its surroundings.
const WRONG_LEVELS: u8 = 40;

/// Every frame of `path` decoded to BGR.
fn decode_bgr(path: &std::path::Path) -> Vec<Vec<u8>> {
    let (pipeline, sink) = file_decoder(path, "video/x-raw,format=BGR");
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut frames = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        let info = gstreamer_video::VideoInfo::from_caps(sample.caps().unwrap()).unwrap();
        let map = sample.buffer().unwrap().map_readable().unwrap();
        let row = info.width() as usize * 3;
        let stride = info.stride()[0] as usize;
        frames.push(
            map.chunks(stride)
                .take(info.height() as usize)
                .flat_map(|r| r[..row].iter().copied())
                .collect(),
        );
    }
    pipeline.set_state(gst::State::Null).unwrap();
    frames
}

/// Pixels of `decoded` (BGR) with a channel more than [`WRONG_LEVELS`] away from `drawn`'s,
/// away from edges: chroma is shared by 2x2 pixels in I420 and blurred when upsampled, so only
/// pixels whose 5x5 neighbourhood is one colour in the drawing are compared.
fn wrong_pixels(decoded: &[u8], drawn: &Mat) -> usize {
    use opencv::core::{self as cv, MatExprTraitConst, Point, Scalar};
    use opencv::imgproc;
    let decoded = Mat::new_rows_cols_with_data(drawn.rows(), drawn.cols() * 3, decoded).unwrap();
    let decoded = decoded.reshape(3, drawn.rows()).unwrap();
    // Flat: the 5x5 minimum and maximum of every channel agree.
    let kernel = Mat::ones(5, 5, cv::CV_8U).unwrap().to_mat().unwrap();
    let (mut low, mut high) = (Mat::default(), Mat::default());
    let anchor = Point::new(-1, -1);
    let border = imgproc::morphology_default_border_value().unwrap();
    imgproc::erode(
        drawn,
        &mut low,
        &kernel,
        anchor,
        1,
        cv::BORDER_REPLICATE,
        border,
    )
    .unwrap();
    imgproc::dilate(
        drawn,
        &mut high,
        &kernel,
        anchor,
        1,
        cv::BORDER_REPLICATE,
        border,
    )
    .unwrap();
    let mut spread = Mat::default();
    cv::absdiff(&high, &low, &mut spread).unwrap();
    let mut diff = Mat::default();
    cv::absdiff(&decoded, drawn, &mut diff).unwrap();
    let (mut spread_max, mut diff_max) = (Mat::default(), Mat::default());
    max_channel(&spread, &mut spread_max);
    max_channel(&diff, &mut diff_max);
    let mut flat = Mat::default();
    cv::compare(&spread_max, &Scalar::all(0.0), &mut flat, cv::CMP_EQ).unwrap();
    let mut far = Mat::default();
    cv::compare(
        &diff_max,
        &Scalar::all(f64::from(WRONG_LEVELS)),
        &mut far,
        cv::CMP_GT,
    )
    .unwrap();
    let mut both = Mat::default();
    cv::bitwise_and(&flat, &far, &mut both, &cv::no_array()).unwrap();
    cv::count_non_zero(&both).unwrap() as usize
}

/// The largest of the three channels of each pixel.
fn max_channel(bgr: &Mat, out: &mut Mat) {
    let mut planes = opencv::core::Vector::<Mat>::new();
    opencv::core::split(bgr, &mut planes).unwrap();
    let mut m = Mat::default();
    opencv::core::max(&planes.get(0).unwrap(), &planes.get(1).unwrap(), &mut m).unwrap();
    opencv::core::max(&m, &planes.get(2).unwrap(), out).unwrap();
}

#[test]
fn the_synthetic_clip_is_real_video_of_the_drawn_frames_with_known_boxes() {
    let scene = Scene::standard();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shapes.mp4");
    scene.write_mp4(&path);
    let decoded = decode_bgr(&path);
    assert_eq!(decoded.len(), scene.frames as usize);
    for (f, pixels) in decoded.iter().enumerate() {
        let drawn = scene.render(f as u32);
        assert_eq!(drawn.cols(), scene.width);
        let wrong = wrong_pixels(pixels, &drawn);
        assert_eq!(
            wrong, 0,
            "frame {f}: {wrong} pixels differ from the drawing"
        );
    }
    // The ground truth the tracking tests rely on.
    let east = scene.mover("east");
    let west = scene.mover("west");
    let stops = scene.mover("stops");
    let in_frame = |b: &vidflow::value::BBox| b.x >= 0.0 && b.x + b.width <= 320.0;
    let hidden: Vec<u32> = scene
        .frames_where(east, in_frame)
        .into_iter()
        .filter(|&f| scene.visible(east, f).is_none())
        .collect();
    assert_eq!(hidden, (64..=67).collect::<Vec<_>>());
    // Wholly in view and not occluded, what is seen is the whole box (the ellipse too).
    for i in [east, west, stops] {
        let f = scene.frames_where(i, |b| b.x > 20.0 && b.x < 100.0)[0];
        assert_eq!(
            scene.visible(i, f),
            scene.bbox(i, f),
            "{}",
            scene.movers[i].name
        );
    }
    let east_mid = scene.crosses_x(east, 160.0).unwrap();
    let west_mid = scene.crosses_x(west, 160.0).unwrap();
    assert!(east_mid.abs_diff(west_mid) <= 2, "{east_mid} {west_mid}");
    assert_eq!(scene.bbox(stops, 60), scene.bbox(stops, 99));
    assert_ne!(scene.bbox(stops, 59), scene.bbox(stops, 60));
    assert_eq!(scene.bbox(stops, 29), None);
}

/// Only a guard against a hang: 100 small frames through `motion` in a debug build.
const RUN_DEADLINE: Duration = Duration::from_secs(120);
/// A reported box is a shape's when it overlaps the visible part of it this much (`motion`
/// boxes are a pixel or two larger than the shape: its mask is dilated).
const SAME_OBJECT_IOU: f32 = 0.5;

/// One reported track on one frame.
#[derive(Debug, Clone)]
struct Reported {
    id: u64,
    bbox: BBox,
    predicted: bool,
}

/// Runs the standard clip through `motion` (with `motion_extra` in its table) and `tracker`;
/// the tracks of every frame, by frame number.
fn track_clip(motion_extra: &str) -> (Scene, Vec<Vec<Reported>>) {
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
{motion_extra}

[steps.follow]
kind = "tracker"
detections = "$steps.moving.detections"
# A hidden shape is reported (predicted) through its occlusion: the default reports none.
report_lost = 30

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.follow.tracks"]
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&pipeline, &[], dir.path()).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    assert_eq!(lines.len(), scene.frames as usize);
    let frames = lines
        .iter()
        .enumerate()
        .map(|(f, line)| {
            assert_eq!(line["frame"].as_u64(), Some(f as u64));
            line["steps.follow.tracks"]
                .as_array()
                .unwrap_or_else(|| panic!("no tracks in {line}"))
                .iter()
                .map(|t| {
                    let b = &t["box"];
                    let v = |k: &str| b[k].as_f64().unwrap() as f32;
                    Reported {
                        id: t["track_id"].as_u64().unwrap(),
                        bbox: BBox {
                            x: v("x"),
                            y: v("y"),
                            width: v("width"),
                            height: v("height"),
                        },
                        predicted: t.get("predicted") == Some(&serde_json::json!(true)),
                    }
                })
                .collect()
        })
        .collect();
    (scene, frames)
}

/// The mover whose visible part a box is, if any.
fn whose(scene: &Scene, frame: u32, bbox: &BBox) -> Option<usize> {
    (0..scene.movers.len()).find(|&i| {
        scene
            .visible(i, frame)
            .is_some_and(|v| v.iou(bbox) >= SAME_OBJECT_IOU)
    })
}

/// For each mover, the IDs of the tracks seen on it (not predicted), with the frames.
fn ids_by_mover(scene: &Scene, frames: &[Vec<Reported>]) -> Vec<BTreeMap<u64, Vec<u32>>> {
    let mut ids = vec![BTreeMap::<u64, Vec<u32>>::new(); scene.movers.len()];
    for (f, tracks) in frames.iter().enumerate() {
        for t in tracks.iter().filter(|t| !t.predicted) {
            let i = whose(scene, f as u32, &t.bbox)
                .unwrap_or_else(|| panic!("frame {f}: track {t:?} is on no shape"));
            ids[i].entry(t.id).or_default().push(f as u32);
        }
    }
    ids
}

/// Every track is reported on every frame from its first to its last (predicted or not).
fn assert_no_holes(frames: &[Vec<Reported>]) {
    let mut span = BTreeMap::<u64, (usize, usize)>::new();
    for (f, tracks) in frames.iter().enumerate() {
        for t in tracks {
            span.entry(t.id).or_insert((f, f)).1 = f;
        }
    }
    for (id, (first, last)) in span {
        for (f, tracks) in frames.iter().enumerate().take(last + 1).skip(first) {
            assert!(
                tracks.iter().any(|t| t.id == id),
                "track {id} (frames {first} to {last}) missing on frame {f}"
            );
        }
    }
}

#[test]
fn each_shape_keeps_one_id_for_its_whole_path_even_through_the_occlusion() {
    let (scene, frames) = track_clip("");
    let ids = ids_by_mover(&scene, &frames);
    let [east, west, stops] = ["east", "west", "stops"].map(|n| scene.mover(n));
    for i in [east, west, stops] {
        assert_eq!(ids[i].len(), 1, "{}: {:?}", scene.movers[i].name, ids[i]);
    }
    let id = |i: usize| *ids[i].keys().next().unwrap();
    let distinct: BTreeSet<u64> = [east, west, stops].map(id).into_iter().collect();
    assert_eq!(distinct.len(), 3, "{ids:?}");
    // East is seen before the pillar and after it, and predicted while hidden behind it.
    let seen = &ids[east][&id(east)];
    let hidden = 64..=67;
    assert!(seen.iter().any(|&f| f < *hidden.start()), "{seen:?}");
    assert!(seen.iter().any(|&f| f > *hidden.end()), "{seen:?}");
    for f in hidden {
        let t = frames[f as usize].iter().find(|t| t.id == id(east));
        assert!(t.is_some_and(|t| t.predicted), "frame {f}: {t:?}");
    }
    // Each moving shape is tracked over most of the frames it is whole in view.
    for i in [east, west] {
        let whole = scene.frames_where(i, |b| b.x >= 0.0 && b.x + b.width <= 320.0);
        let tracked = whole.iter().filter(|f| ids[i][&id(i)].contains(f)).count();
        assert!(
            tracked * 10 >= whole.len() * 7,
            "{}: tracked on {tracked} of {} frames",
            scene.movers[i].name,
            whole.len()
        );
    }
    assert_no_holes(&frames);
}

#[test]
fn with_the_detector_on_every_other_frame_tracks_are_on_every_frame() {
    let (scene, frames) = track_clip("every_n_frames = 2");
    let ids = ids_by_mover(&scene, &frames);
    for name in ["east", "west"] {
        let i = scene.mover(name);
        assert_eq!(ids[i].len(), 1, "{name}: {:?}", ids[i]);
    }
    for (f, tracks) in frames.iter().enumerate() {
        if f % 2 == 1 {
            assert!(tracks.iter().all(|t| t.predicted), "frame {f}: {tracks:?}");
        }
    }
    let east = scene.mover("east");
    let east_id = *ids[east].keys().next().unwrap();
    let reported = frames
        .iter()
        .filter(|tracks| tracks.iter().any(|t| t.id == east_id))
        .count();
    // Seen on even frames only, reported on the odd ones between.
    assert!(
        reported >= 2 * ids[east][&east_id].len() - 1,
        "{reported} {:?}",
        ids[east]
    );
    assert_no_holes(&frames);
}
