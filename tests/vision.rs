//! Real detectors on real video through the real `vidflow` binary, against reference boxes made
//! by an independent decoder (Python OpenCV from PyPI: its own FFmpeg, DNN and FaceDetectorYN;
//! `tests/fixtures/vision/make-references.py`) and looked at, drawn on their frames. Models come
//! from `scripts/fetch-assets` (models/), media from assets/.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use vidflow::value::BBox;

use common::vision::{MIN_RECALL, RUN_DEADLINE, detections, models_dir, recall, references, run};

fn source(uri: &Path) -> String {
    format!(
        "[sources.clip]\nuri = \"{}\"\n\n[executor]\nworkers = 2\n",
        uri.display()
    )
}

#[test]
fn object_detection_finds_the_reference_people_of_vtest_and_no_class_it_was_not_asked_for() {
    let refs = references("vtest-people.json");
    let last = *refs.keys().max().unwrap();
    let pipeline = format!(
        r#"{}
[steps.detect]
kind = "object_detection"
image = "$frame"
classes = ["person"]

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.detect.detections"]
"#,
        source(&asset("vtest.avi"))
    );
    let lines = run(&pipeline, last + 1);
    let (matched, total) = recall(&lines, "steps.detect.detections", "person", &refs);
    assert!(
        matched as f64 >= MIN_RECALL * total as f64,
        "{matched} of {total} reference people found"
    );
    // Unfiltered, yolov3_tiny_coco also sees the parked van ("truck") and car at the top of
    // every one of these frames.
    let mut people = 0;
    for line in &lines {
        for (class, _, d) in detections(line, "steps.detect.detections") {
            assert_eq!(class, "person", "{d}");
            people += 1;
        }
    }
    assert!(people >= total, "{people} people in {} frames", lines.len());
}

#[test]
fn face_detection_finds_the_faces_of_megamind_with_their_landmarks() {
    let refs = references("megamind-faces.json");
    let last = *refs.keys().max().unwrap();
    let pipeline = format!(
        r#"{}
[steps.faces]
kind = "face_detection"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.faces.detections"]
"#,
        source(&asset("Megamind.avi"))
    );
    let lines = run(&pipeline, last + 1);
    let with_faces = lines
        .iter()
        .filter(|l| !detections(l, "steps.faces.detections").is_empty())
        .count();
    // The clip opens with a fade from black: most frames, not all, show faces.
    assert!(
        with_faces * 4 >= lines.len() * 3,
        "faces on {with_faces} of {} frames",
        lines.len()
    );
    let (matched, total) = recall(&lines, "steps.faces.detections", "face", &refs);
    assert!(
        matched as f64 >= MIN_RECALL * total as f64,
        "{matched} of {total} reference faces found"
    );
    for line in &lines {
        for (_, b, d) in detections(line, "steps.faces.detections") {
            let points = d["landmarks"].as_array().unwrap_or_else(|| panic!("{d}"));
            assert_eq!(points.len(), 5, "{d}");
            // Eyes, nose and mouth lie within the face box (a little slack for tilted heads).
            for p in points {
                let (x, y) = (p[0].as_f64().unwrap() as f32, p[1].as_f64().unwrap() as f32);
                let slack = b.width.max(b.height) * 0.2;
                assert!(
                    x >= b.x - slack
                        && x <= b.x + b.width + slack
                        && y >= b.y - slack
                        && y <= b.y + b.height + slack,
                    "{d}"
                );
            }
        }
    }
}

#[test]
fn hog_finds_people_and_a_haar_cascade_finds_faces() {
    let people = references("vtest-people.json");
    let pipeline = format!(
        r#"{}
[steps.hog]
kind = "people_detection"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.hog.detections"]
"#,
        source(&asset("vtest.avi"))
    );
    let lines = run(&pipeline, 1);
    // HOG's boxes are loose (its window is 64x128 with a margin): a person is found when a box
    // holds the centre of a reference person of frame 0.
    let found = detections(&lines[0], "steps.hog.detections");
    let held = people[&0]
        .iter()
        .filter(|r| {
            let (cx, cy) = (r.x + r.width / 2.0, r.y + r.height / 2.0);
            found.iter().any(|(class, b, _)| {
                class == "person"
                    && cx >= b.x
                    && cx <= b.x + b.width
                    && cy >= b.y
                    && cy <= b.y + b.height
            })
        })
        .count();
    assert!(
        held >= 2,
        "{held} of frame 0's people in HOG boxes: {found:?}"
    );

    let faces = references("megamind-faces.json");
    let pipeline = format!(
        r#"{}
[steps.cascade]
kind = "cascade_detection"
image = "$frame"
path = "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml"
class = "face"
min_neighbors = 5

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.cascade.detections"]
"#,
        source(&asset("Megamind.avi"))
    );
    let lines = run(&pipeline, 41);
    // Both frontal faces (hers and the man's behind) on frames 10 to 40.
    let faces: BTreeMap<u64, Vec<BBox>> = faces.into_iter().filter(|(f, _)| *f <= 40).collect();
    let (matched, total) = recall(&lines, "steps.cascade.detections", "face", &faces);
    assert!(
        matched as f64 >= MIN_RECALL * total as f64,
        "{matched} of {total} reference faces found by the cascade"
    );
}

/// `vidflow validate` of `pipeline` with the models taken from `models`.
fn validate(pipeline: &str, models: &Path) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.toml", pipeline);
    spawn(
        dir.path(),
        &["validate", path.to_str().unwrap()],
        &[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())],
    )
    .finish(RUN_DEADLINE)
}

const DETECT: &str = r#"[sources.cam]
uri = "test://ball"

[steps.detect]
kind = "object_detection"
image = "$frame"
"#;

/// A models directory holding copies of the real files, with `file` replaced by `contents`.
fn models_with(file: &str, contents: Option<&[u8]>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "yolov3-tiny.weights",
        "yolov3-tiny.cfg",
        "coco.names",
        "yolov3-tiny.onnx",
        "yolov3-tiny-int8.onnx",
    ] {
        let to = dir.path().join(name);
        if name != file {
            std::fs::copy(models_dir().join(name), &to).unwrap();
        } else if let Some(contents) = contents {
            std::fs::write(&to, contents).unwrap();
        }
    }
    dir
}

#[test]
fn a_missing_or_altered_model_file_is_a_validate_error_naming_the_model_and_the_fetch_command() {
    let ok = validate(DETECT, &models_dir());
    assert!(ok.status.success(), "{}", ok.stderr);

    let missing = models_with("yolov3-tiny.weights", None);
    let out = validate(DETECT, missing.path());
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    for part in [
        // At the step's name: the default model is not written anywhere in the file.
        ":4:8: step \"detect\": model \"yolov3_tiny_coco\"",
        "yolov3-tiny.weights is missing",
        "scripts/fetch-assets",
    ] {
        assert!(out.stderr.contains(part), "{part:?} not in {}", out.stderr);
    }

    // The cfg as shipped, before fetch-assets fixes its second mask: a wrong sha256.
    let shipped = std::fs::read_to_string(models_dir().join("yolov3-tiny.cfg"))
        .unwrap()
        .replacen("mask = 1,2,3", "mask = 0,1,2", 1);
    let altered = models_with("yolov3-tiny.cfg", Some(shipped.as_bytes()));
    let out = validate(DETECT, altered.path());
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    for part in [
        "model \"yolov3_tiny_coco\"",
        "yolov3-tiny.cfg is corrupt (sha256",
        "expected f9bd093d",
        "scripts/fetch-assets",
    ] {
        assert!(out.stderr.contains(part), "{part:?} not in {}", out.stderr);
    }
}

#[test]
fn a_model_opencv_cannot_read_is_a_validate_error_not_a_crash_at_the_first_frame() {
    let dir = tempfile::tempdir().unwrap();
    // Half a real network: a truncated ONNX file.
    let onnx = std::fs::read(models_dir().join("face_detection_yunet_2023mar.onnx")).unwrap();
    std::fs::write(dir.path().join("broken.onnx"), &onnx[..onnx.len() / 2]).unwrap();
    std::fs::write(dir.path().join("names.txt"), "person\ncar\n").unwrap();
    let pipeline = format!(
        r#"[sources.cam]
uri = "test://ball"

[steps.detect]
kind = "object_detection"
image = "$frame"
model_path = "{0}/broken.onnx"
layout = "yolov5"
class_names = "{0}/names.txt"
"#,
        dir.path().display()
    );
    let out = validate(&pipeline, &models_dir());
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(
        out.stderr.contains("broken.onnx\": opencv cannot read"),
        "{}",
        out.stderr
    );
}

#[test]
fn fetch_assets_check_names_every_file_whose_sum_is_not_the_one_models_toml_records() {
    let check = |models: &Path| {
        let out = std::process::Command::new(repo_root().join("scripts/fetch-assets"))
            .arg("--check")
            .env("VIDFLOW_MODELS_DIR", models)
            .output()
            .unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (out.status.code(), text(out.stdout), text(out.stderr))
    };
    let (code, stdout, stderr) = check(&models_dir());
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("every file models.toml names is in"),
        "{stdout}"
    );

    // The same files (links), but for one with a byte changed and one missing.
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(models_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        match name.to_str().unwrap() {
            "yolov12n-int8.onnx" => {
                let mut bytes = std::fs::read(&path).unwrap();
                let middle = bytes.len() / 2;
                bytes[middle] ^= 1;
                std::fs::write(dir.path().join(&name), bytes).unwrap();
            }
            "yolov3-tiny.cfg" => {}
            _ => std::os::unix::fs::symlink(&path, dir.path().join(&name)).unwrap(),
        }
    }
    let (code, _, stderr) = check(dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    let named: Vec<&str> = stderr.lines().collect();
    assert_eq!(named.len(), 2, "{stderr}");
    assert!(
        named
            .iter()
            .any(|l| l.contains("yolov3-tiny.cfg is missing")),
        "{stderr}"
    );
    assert!(
        named
            .iter()
            .any(|l| l.contains("yolov12n-int8.onnx is not the file models.toml records")),
        "{stderr}"
    );
}
