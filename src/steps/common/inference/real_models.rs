//! The real models on the real runtimes (`scripts/fetch-assets`, `scripts/fetch-runtimes`):
//! every f32 engine gives OpenCV's outputs, an engine compiled for one input size gives the same
//! values at another, int8 runs the quantized copy, YOLOv12n's free-size copy gives the
//! export's outputs on every engine that reads it, and OpenVINO keeps its compiled shapes
//! within a budget of bytes it measures.

use super::kept::Budget;
use super::openvino::{MIN_SHAPE_BYTES, OvEngine};
use super::*;
use crate::steps::common::models::models_dir;

fn blob(image: &Mat, side: i32) -> Mat {
    opencv::dnn::blob_from_image(
        image,
        1.0 / 255.0,
        opencv::core::Size::new(side, side),
        opencv::core::Scalar::default(),
        true,
        false,
        opencv::core::CV_32F,
    )
    .unwrap()
}

fn yolo_blob(side: i32) -> Mat {
    let (image, real) = check_image(Some(&models_dir().join("check-street.png")));
    assert!(real, "models/check-street.png: run scripts/fetch-assets");
    blob(&image, side)
}

/// The largest difference between two engines' outputs, which must have the same shapes (but
/// for a leading batch of 1, which OpenCV leaves out); a value that is not a number in either
/// fails.
fn max_difference(a: &[Tensor], b: &[Tensor]) -> f32 {
    let shapes = |t: &[Tensor]| {
        t.iter()
            .map(|t| agree::unbatched(&t.shape).to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(shapes(a), shapes(b));
    let mut worst = 0.0_f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.data.len(), y.data.len());
        for (p, q) in x.data.iter().zip(&y.data) {
            assert!(
                p.is_finite() && q.is_finite(),
                "not a number: {p} against {q}"
            );
            worst = worst.max((p - q).abs());
        }
    }
    worst
}

fn engine(backend: Backend, precision: Precision, files: &ModelFiles) -> Box<dyn Engine> {
    availability(backend).unwrap();
    load_engine(
        backend,
        precision,
        Files {
            opencv: files,
            others: files,
        },
        1,
    )
    .unwrap()
}

/// Every f32 engine against OpenCV on `files`, for `input`.
fn f32_engines_match_opencv(files: Files<'_>, input: &Mat) {
    let reference = load_engine(Backend::OpenCv, Precision::F32, files, 1)
        .unwrap()
        .forward(input)
        .unwrap();
    assert!(reference.iter().any(|t| t.data.iter().any(|v| *v > 0.5)));
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        availability(backend).unwrap();
        let engine = load_engine(backend, Precision::F32, files, 1).unwrap();
        let outputs = engine.forward(input).unwrap();
        let worst = max_difference(&reference, &outputs);
        assert!(
            worst <= 1e-4,
            "{} {}: outputs differ from OpenCV's by {worst}",
            files.others.label,
            backend.name()
        );
    }
}

fn yolov3_tiny(onnx_int8: bool) -> ModelFiles {
    let dir = models_dir();
    ModelFiles {
        label: "yolov3_tiny_coco".to_owned(),
        darknet: Some((dir.join("yolov3-tiny.weights"), dir.join("yolov3-tiny.cfg"))),
        onnx: Some(dir.join("yolov3-tiny.onnx")),
        onnx_int8: onnx_int8.then(|| dir.join("yolov3-tiny-int8.onnx")),
        outputs: Some(vec!["yolo_16".to_owned(), "yolo_23".to_owned()]),
        opencv_refuses: None,
    }
}

#[test]
fn f32_engines_give_opencvs_outputs_within_1e_4() {
    let dir = models_dir();
    let yolo = yolov3_tiny(false);
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    for side in [320, 416] {
        f32_engines_match_opencv(files, &yolo_blob(side));
    }
    let outputs: Vec<String> = ["cls_8", "obj_16", "bbox_32", "kps_8"]
        .map(str::to_owned)
        .to_vec();
    let yunet = ModelFiles {
        label: "yunet_face".to_owned(),
        darknet: None,
        onnx: Some(dir.join("face_detection_yunet_2023mar-dynamic.onnx")),
        onnx_int8: None,
        outputs: Some(outputs),
        opencv_refuses: None,
    };
    let yunet_opencv = ModelFiles {
        onnx: Some(dir.join("face_detection_yunet_2023mar.onnx")),
        ..yunet.clone()
    };
    let (image, _) = check_image(Some(&dir.join("check-faces.png")));
    let mut padded = Mat::default();
    let pad = |n: i32| (n + 31) / 32 * 32 - n;
    opencv::core::copy_make_border(
        &image,
        &mut padded,
        0,
        pad(image.rows()),
        0,
        pad(image.cols()),
        opencv::core::BORDER_CONSTANT,
        opencv::core::Scalar::default(),
    )
    .unwrap();
    let blob = opencv::dnn::blob_from_image_def(&padded).unwrap();
    f32_engines_match_opencv(
        Files {
            opencv: &yunet_opencv,
            others: &yunet,
        },
        &blob,
    );
}

#[test]
fn a_nan_in_an_output_fails_the_comparison() {
    let a = [Tensor {
        shape: vec![1, 2],
        data: vec![0.0, 1.0],
    }];
    let b = [Tensor {
        shape: vec![1, 2],
        data: vec![0.0, f32::NAN],
    }];
    assert!(std::panic::catch_unwind(|| max_difference(&a, &b)).is_err());
    let c = [Tensor {
        shape: vec![2, 1],
        data: vec![0.0, 1.0],
    }];
    assert!(std::panic::catch_unwind(|| max_difference(&a, &c)).is_err());
}

#[test]
fn an_engine_compiled_for_one_size_gives_at_another_what_opencv_gives() {
    let yolo = yolov3_tiny(false);
    let opencv = engine(Backend::OpenCv, Precision::F32, &yolo);
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        let engine = engine(backend, Precision::F32, &yolo);
        // 320, then 416 (OpenVINO compiles again), then back to 320.
        for side in [320, 416, 320] {
            let input = yolo_blob(side);
            let outputs = engine.forward(&input).unwrap();
            // Rows of 85 per cell and anchor, at strides 32 and 16.
            let rows = |stride: i32| ((side / stride) * (side / stride) * 3) as usize;
            let shapes: Vec<_> = outputs.iter().map(|t| t.shape.clone()).collect();
            assert_eq!(
                shapes,
                [vec![1, rows(32), 85], vec![1, rows(16), 85]],
                "{} at {side}",
                backend.name()
            );
            // OpenCV gives [rows, 85]: the same values.
            let reference = opencv.forward(&input).unwrap();
            let worst = max_difference(&reference, &outputs);
            assert!(worst <= 1e-4, "{} at {side}: {worst}", backend.name());
        }
    }
}

#[test]
fn openvino_compiles_each_shape_once_however_the_shapes_alternate() {
    // Two cameras of other shapes through one step, frame by frame: 320, 416, 320, 416...
    let yolo = yolov3_tiny(false);
    let path = yolo.onnx.clone().unwrap();
    availability(Backend::OpenVino).unwrap();
    // A budget of its own (the process's is shared by the tests running meanwhile).
    let budget = Box::leak(Box::new(Budget::new(u64::MAX)));
    let engine = OvEngine::load(&path, None, Precision::F32, 1)
        .unwrap()
        .with_budget(budget);
    let inputs = [yolo_blob(320), yolo_blob(416)];
    let first: Vec<_> = inputs.iter().map(|i| engine.forward(i).unwrap()).collect();
    for round in 0..3 {
        for (input, expected) in inputs.iter().zip(&first) {
            let outputs = engine.forward(input).unwrap();
            assert_eq!(max_difference(expected, &outputs), 0.0, "round {round}");
        }
    }
    assert_eq!(engine.compiles(), 2);
    // Each shape's cost was measured, not the least taken (yolov3-tiny's is about 100 MB).
    assert!(
        budget.kept() > 2 * MIN_SHAPE_BYTES,
        "{} bytes",
        budget.kept()
    );
}

#[test]
fn openvino_drops_compiled_shapes_past_its_budget_and_gives_their_bytes_back() {
    let yolo = yolov3_tiny(false);
    availability(Backend::OpenVino).unwrap();
    // A budget of one byte: each new shape drops the others (the one it runs on is kept).
    let budget = Box::leak(Box::new(Budget::new(1)));
    let engine = OvEngine::load(&yolo.onnx.clone().unwrap(), None, Precision::F32, 1)
        .unwrap()
        .with_budget(budget);
    let inputs = [yolo_blob(320), yolo_blob(416)];
    engine.forward(&inputs[0]).unwrap();
    let one = budget.kept();
    assert!(one > MIN_SHAPE_BYTES, "{one} bytes");
    engine.forward(&inputs[0]).unwrap();
    engine.forward(&inputs[1]).unwrap();
    engine.forward(&inputs[0]).unwrap();
    assert_eq!(
        engine.compiles(),
        3,
        "320 was dropped for 416, and compiled again"
    );
    drop(engine);
    assert_eq!(budget.kept(), 0);
}

/// Person boxes (score >= 0.3, before suppression) of yolov3-tiny's rows of 85, as
/// `[cx, cy, w, h]` fractions of the input.
fn darknet_people(outputs: &[Tensor]) -> Vec<[f32; 4]> {
    outputs
        .iter()
        .flat_map(|t| t.data.chunks_exact(85))
        .filter(|row| row[5] >= 0.3)
        .map(|row| [row[0], row[1], row[2], row[3]])
        .collect()
}

#[test]
fn int8_runs_the_quantized_copy_and_only_where_there_is_one() {
    let yolo = yolov3_tiny(true);
    // The quantized file read as a network of its own.
    let quantized_file = ModelFiles {
        onnx: yolo.onnx_int8.clone(),
        ..yolo.clone()
    };
    let blob = yolo_blob(416);
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        let run = |files: &ModelFiles, precision| {
            engine(backend, precision, files).forward(&blob).unwrap()
        };
        let full = run(&yolo, Precision::F32);
        let int8 = run(&yolo, Precision::Int8);
        // It is that file that runs: its values exactly.
        let itself = run(&quantized_file, Precision::F32);
        assert_eq!(max_difference(&int8, &itself), 0.0, "{}", backend.name());
        // Quantization moved the values (the f32 file would give them to 1e-6)...
        let moved = max_difference(&full, &int8);
        assert!(
            moved > 1e-3,
            "{}: int8 differs by only {moved}",
            backend.name()
        );
        // ...and kept the people: each f32 person box has an int8 one within 2% of the input.
        let (f, q) = (darknet_people(&full), darknet_people(&int8));
        assert!(f.len() >= 3, "{} f32 candidates", f.len());
        for a in &f {
            assert!(
                q.iter()
                    .any(|b| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 0.02)),
                "{}: int8 has no person box near f32's {a:?}: {q:?}",
                backend.name()
            );
        }
    }
    let without = ModelFiles {
        onnx_int8: None,
        ..yolov3_tiny(true)
    };
    let files = Files {
        opencv: &without,
        others: &without,
    };
    let e = load_engine(Backend::OnnxRuntime, Precision::Int8, files, 1).unwrap_err();
    assert!(e.contains("has no int8 copy"), "{e}");
}

fn yolov12n(onnx: &str) -> ModelFiles {
    ModelFiles {
        label: "yolov12n_coco".to_owned(),
        darknet: None,
        onnx: Some(models_dir().join(onnx)),
        onnx_int8: Some(models_dir().join("yolov12n-int8.onnx")),
        outputs: None,
        opencv_refuses: None,
    }
}

#[test]
fn yolov12n_free_size_gives_the_exports_outputs_at_640_and_runs_at_other_sizes() {
    let export = yolov12n("yolov12n.onnx");
    let free = yolov12n("yolov12n-dynamic.onnx");
    let input = yolo_blob(640);
    let reference = engine(Backend::OnnxRuntime, Precision::F32, &export)
        .forward(&input)
        .unwrap();
    assert_eq!(reference[0].shape, [1, 84, 8400]);
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        let engine = engine(backend, Precision::F32, &free);
        // Box coordinates are input pixels (up to 640): within 1e-4 of 1 + |value|.
        let outputs = engine.forward(&input).unwrap();
        let worst = max_difference(&reference, &outputs);
        let largest = reference[0]
            .data
            .iter()
            .fold(0.0_f32, |m, v| m.max(v.abs()));
        assert!(
            worst <= 1e-4 * (1.0 + largest),
            "{}: {worst}",
            backend.name()
        );
        for side in [320, 416] {
            let outputs = engine.forward(&yolo_blob(side)).unwrap();
            let anchors = [8, 16, 32]
                .map(|s| (side / s) * (side / s))
                .iter()
                .sum::<i32>();
            assert_eq!(outputs[0].shape, [1, 84, anchors as usize], "{side}");
            agree::finite(&outputs).unwrap();
        }
    }
    // The export itself is held to 640.
    let e = engine(Backend::OnnxRuntime, Precision::F32, &export)
        .forward(&yolo_blob(416))
        .unwrap_err();
    assert!(e.to_string().contains("416"), "{e}");
}

#[test]
fn forward_with_writes_and_reads_in_place_what_forward_gives() {
    let dir = models_dir();
    let yolo = ModelFiles {
        label: "yolov3_tiny_coco".to_owned(),
        darknet: Some((dir.join("yolov3-tiny.weights"), dir.join("yolov3-tiny.cfg"))),
        onnx: Some(dir.join("yolov3-tiny.onnx")),
        onnx_int8: None,
        outputs: Some(vec!["yolo_16".to_owned(), "yolo_23".to_owned()]),
        opencv_refuses: None,
    };
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    let blob = yolo_blob(320);
    let values = blob.data_typed::<f32>().unwrap();
    for backend in [Backend::OpenCv, Backend::OnnxRuntime, Backend::OpenVino] {
        let engine = load_engine(backend, Precision::F32, files, 1).unwrap();
        let want = engine.forward(&blob).unwrap();
        let zeros =
            Mat::new_nd_with_default(&[1, 3, 320, 320], opencv::core::CV_32F, 0.0.into()).unwrap();
        // Twice, each after a pass on another input, whose buffers it then gets (OpenVINO's
        // request): what it writes must replace them.
        for _ in 0..2 {
            engine.forward(&zeros).unwrap();
            let mut got = Vec::new();
            engine
                .forward_with(
                    [1, 3, 320, 320],
                    &mut |input| {
                        input.copy_from_slice(values);
                        Ok(())
                    },
                    &mut |outputs| {
                        got = outputs
                            .iter()
                            .map(|o| (o.shape.clone(), o.data.to_vec()))
                            .collect();
                        Ok(())
                    },
                )
                .unwrap();
            let want: Vec<(Vec<usize>, Vec<f32>)> = want
                .iter()
                .map(|t| (t.shape.clone(), t.data.clone()))
                .collect();
            assert_eq!(got, want, "{}", backend.name());
        }
    }
}

#[test]
fn a_precision_of_the_list_that_fails_here_is_an_error_not_a_fall_back() {
    // The int8 copy is offered (the file is there) but broken: precision = ["int8", "f32"] is
    // that error, never f32 run quietly in its place. A precision not offered at all (no int8
    // copy) is the one case that moves on to the next.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("yolov3-tiny-int8.onnx");
    std::fs::write(&broken, b"this is not a network".repeat(100)).unwrap();
    let mut yolo = yolov3_tiny(false);
    let input = |_: &Mat| Ok(yolo_blob(416));
    let detections = |_: &Mat, _: &[Tensor]| Ok(Vec::new());
    let fits = |_: &[Tensor]| Ok(());
    let check = Check {
        image: Mat::default(),
        real: true,
        clip: None,
        input: &input,
        input_name: "input_size 416".to_owned(),
        detections: &detections,
        fits: &fits,
        settings: String::new(),
    };
    let request = Request {
        backend: Some(Backend::OnnxRuntime),
        precision: Some(Precisions([
            Some(Precision::Int8),
            Some(Precision::F32),
            None,
        ])),
        threads: 1,
    };
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    let taken = load_named(Backend::OnnxRuntime, files, request, &check).unwrap();
    assert_eq!(taken.precision, Precision::F32, "no int8 copy: f32");
    yolo.onnx_int8 = Some(broken);
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    let e = match load_named(Backend::OnnxRuntime, files, request, &check) {
        Ok(n) => panic!("a broken int8 copy ran as {}", n.precision.name()),
        Err(e) => e.message,
    };
    assert!(
        e.contains("precision int8") && e.contains("yolov3-tiny-int8.onnx"),
        "{e}"
    );
}
