//! The real models on the real runtimes (`scripts/fetch-assets`, `scripts/fetch-runtimes`):
//! every f32 engine gives OpenCV's outputs, engines follow a new input size, int8 runs the
//! quantized copy.

use super::*;
use crate::steps::models::models_dir;

fn yolo_blob(side: i32) -> Mat {
    let (image, real) = check_image(Some(&models_dir().join("check-street.png")));
    assert!(real, "models/check-street.png: run scripts/fetch-assets");
    opencv::dnn::blob_from_image(
        &image,
        1.0 / 255.0,
        opencv::core::Size::new(side, side),
        opencv::core::Scalar::default(),
        true,
        false,
        opencv::core::CV_32F,
    )
    .unwrap()
}

fn max_difference(a: &[Tensor], b: &[Tensor]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!(x.data.len(), y.data.len());
            x.data
                .iter()
                .zip(&y.data)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
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
        let shapes = |t: &[Tensor]| t.iter().map(|t| t.data.len()).collect::<Vec<_>>();
        assert_eq!(shapes(&outputs), shapes(&reference), "{}", backend.name());
        let worst = max_difference(&reference, &outputs);
        assert!(
            worst <= 1e-4,
            "{} {}: outputs differ from OpenCV's by {worst}",
            files.others.label,
            backend.name()
        );
    }
}

#[test]
fn f32_engines_give_opencvs_outputs_within_1e_4() {
    let dir = models_dir();
    let yolo = ModelFiles {
        label: "yolov3_tiny_coco".to_owned(),
        darknet: Some((dir.join("yolov3-tiny.weights"), dir.join("yolov3-tiny.cfg"))),
        onnx: Some(dir.join("yolov3-tiny.onnx")),
        onnx_int8: None,
        outputs: Some(vec!["yolo_16".to_owned(), "yolo_23".to_owned()]),
    };
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
fn an_engine_compiled_for_one_size_runs_another() {
    let dir = models_dir();
    let yolo = ModelFiles {
        label: "yolov3_tiny_coco".to_owned(),
        darknet: None,
        onnx: Some(dir.join("yolov3-tiny.onnx")),
        onnx_int8: None,
        outputs: None,
    };
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        let engine = load_engine(backend, Precision::F32, files, 1).unwrap();
        for side in [320, 416, 320] {
            let outputs = engine.forward(&yolo_blob(side)).unwrap();
            // Rows of 85 per cell and anchor, at strides 32 and 16.
            let cells = |stride: i32| ((side / stride) * (side / stride) * 3 * 85) as usize;
            assert_eq!(
                outputs.iter().map(|t| t.data.len()).collect::<Vec<_>>(),
                vec![cells(32), cells(16)],
                "{} at {side}",
                backend.name()
            );
        }
    }
}

#[test]
fn int8_runs_the_quantized_copy_and_only_where_there_is_one() {
    let dir = models_dir();
    let mut yolo = ModelFiles {
        label: "yolov3_tiny_coco".to_owned(),
        darknet: None,
        onnx: Some(dir.join("yolov3-tiny.onnx")),
        onnx_int8: Some(dir.join("yolov3-tiny-int8.onnx")),
        outputs: None,
    };
    let blob = yolo_blob(320);
    for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
        let files = Files {
            opencv: &yolo,
            others: &yolo,
        };
        let run = |precision| {
            load_engine(backend, precision, files, 1)
                .unwrap()
                .forward(&blob)
                .unwrap()
        };
        let (full, quantized) = (run(Precision::F32), run(Precision::Int8));
        // Quantization moves the values (the same file would give them to 1e-6).
        let moved = max_difference(&full, &quantized);
        assert!(
            moved > 1e-3,
            "{}: int8 differs by only {moved}",
            backend.name()
        );
    }
    yolo.onnx_int8 = None;
    let files = Files {
        opencv: &yolo,
        others: &yolo,
    };
    let e = load_engine(Backend::OnnxRuntime, Precision::Int8, files, 1).unwrap_err();
    assert!(e.contains("has no int8 copy"), "{e}");
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
                        got = outputs.iter().map(|o| o.to_vec()).collect();
                        Ok(())
                    },
                )
                .unwrap();
            let want: Vec<&[f32]> = want.iter().map(|t| &t.data[..]).collect();
            assert_eq!(got, want, "{}", backend.name());
        }
    }
}
