//! `face_detection`: faces and their five landmarks, by the YuNet network (`yunet_face` of
//! `models/models.toml`) run by the engine the step names or `auto` picks ([`inference`]:
//! OpenCV's DNN, ONNX Runtime or OpenVINO; the latter two read the model's `onnx` file, the same
//! network with its input size left free).
//!
//! OpenCV 4.6's `FaceDetectorYN` cannot run the 2023 YuNet, so this step does what later
//! OpenCV versions do: the image, padded right and below to a multiple of 32, goes in as BGR
//! 0..255; the twelve outputs `cls_/obj_/bbox_/kps_{8,16,32}` are decoded here ([`decode`]),
//! score = sqrt(cls x obj), then non-maximum suppression. Boxes and landmarks are in pixels of
//! the image the step was given.
//!
//! Threads: the engine keeps one network per worker that runs the step at the same moment,
//! made lazily and reused for every frame.

use std::sync::Arc;

use opencv::core::{self, Mat, MatTraitConst, Rect, Scalar, Vector};
use opencv::dnn;
use serde::Deserialize;
use toml::Spanned;

use super::common::inference::{self, Check, ModelFiles, Network, Request, Tensor};
use super::common::models;
use super::{DETECTIONS_OUT, IMAGE_IN, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Detection, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "face_detection",
    summary: "faces with 5 landmarks (eyes, nose tip, mouth corners) by YuNet (OpenCV DNN, ONNX Runtime or OpenVINO)",
    inputs: IMAGE_IN,
    outputs: DETECTIONS_OUT,
    params: &[
        ParamDoc {
            name: "model",
            ty: "string",
            default: "\"yunet_face\"",
            doc: "a YuNet model of models/models.toml",
        },
        ParamDoc {
            name: "confidence",
            ty: "float in [0, 1]",
            default: "0.6",
            doc: "lowest face score kept",
        },
        ParamDoc {
            name: "nms_iou",
            ty: "float in [0, 1]",
            default: "0.3",
            doc: "faces overlapping more than this (IoU) are merged",
        },
        inference::BACKEND_DOC,
        inference::PRECISION_DOC,
        inference::THREADS_DOC,
    ],
    stateful: false,
    build,
};

const DEFAULT_MODEL: &str = "yunet_face";
/// YuNet's output strides; the input is padded to a multiple of the largest.
const STRIDES: [usize; 3] = [8, 16, 32];
/// Output names, in the order [`decode`] takes them.
const OUTPUTS: [&str; 12] = [
    "cls_8", "cls_16", "cls_32", "obj_8", "obj_16", "obj_32", "bbox_8", "bbox_16", "bbox_32",
    "kps_8", "kps_16", "kps_32",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    model: Option<Spanned<String>>,
    confidence: Option<Spanned<f32>>,
    nms_iou: Option<Spanned<f32>>,
    backend: Option<Spanned<String>>,
    precision: Option<Spanned<inference::PrecisionText>>,
    threads: Option<Spanned<u32>>,
}

struct FaceDetection {
    network: Network,
    faces: Faces,
}

/// How an image goes in and the faces come out: everything but the engine.
struct Faces {
    class: Arc<str>,
    confidence: f32,
    nms_iou: f32,
}

impl std::fmt::Debug for FaceDetection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaceDetection")
            .field("network", &self.network.describe())
            .finish_non_exhaustive()
    }
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let name = c
        .model
        .as_ref()
        .map_or(DEFAULT_MODEL, |m| m.get_ref().as_str());
    let fail = |message: String| match &c.model {
        Some(m) => Diagnostic::at(m.span(), message),
        None => Diagnostic::new(message),
    };
    let checked = models::checked(name).map_err(|e| fail(e.to_string()))?;
    if checked.model.layout != "yunet" {
        return Err(fail(format!(
            "model \"{name}\" has layout \"{}\"; face_detection takes \"yunet\"",
            checked.model.layout
        )));
    }
    let path = checked
        .file("model")
        .ok_or_else(|| fail(format!("model \"{name}\" names no model file")))?;
    let class: Arc<str> = checked
        .class_names(name)
        .map_err(|e| fail(e.to_string()))?
        .first()
        .map_or_else(|| "face".into(), |c| c.as_str().into());
    let request = Request::parse(c.backend.as_ref(), c.precision.as_ref(), c.threads.as_ref())?;
    let faces = Faces {
        class,
        confidence: fraction("confidence", c.confidence.as_ref(), 0.6)?,
        nms_iou: fraction("nms_iou", c.nms_iou.as_ref(), 0.3)?,
    };
    let label = format!("model \"{name}\"");
    let files = ModelFiles {
        label: label.clone(),
        darknet: None,
        onnx: checked.file("onnx").or_else(|| Some(path.clone())),
        onnx_int8: checked.file("onnx_int8"),
        outputs: Some(OUTPUTS.map(str::to_owned).to_vec()),
        opencv_refuses: None,
    };
    let network = {
        let (image, real) = inference::check_image(checked.check_image().as_deref());
        let input = |image: &Mat| Ok(Faces::blob(image)?.0);
        let detections = |image: &Mat, outputs: &[Tensor]| {
            // The padded input's size, as Faces::blob makes it.
            let pad = |n: i32| (n.max(0) as usize).div_ceil(32) * 32;
            faces.found(outputs, pad(image.cols()), pad(image.rows()))
        };
        let fits = |outputs: &[Tensor]| match outputs.len() {
            12 => Ok(()),
            n => Err(format!("yunet gives 12 outputs, not {n}")),
        };
        let opencv_files = ModelFiles {
            onnx: Some(path.clone()),
            ..files.clone()
        };
        inference::load_with(
            &files,
            &opencv_files,
            request,
            &Check {
                image,
                real,
                clip: checked.check_clip(),
                input: &input,
                input_name: "the image padded to a multiple of 32".to_owned(),
                detections: &detections,
                fits: &fits,
                settings: format!("{} {}", faces.confidence, faces.nms_iou),
            },
        )
        .map_err(|d| match (&c.backend, d.span.is_none()) {
            (Some(b), true) => Diagnostic::at(b.span(), d.message),
            _ => fail(d.message),
        })?
    };
    Ok(Box::new(FaceDetection { network, faces }))
}

fn fraction(key: &str, v: Option<&Spanned<f32>>, default: f32) -> Result<f32, Diagnostic> {
    match v {
        None => Ok(default),
        Some(v) if (0.0..=1.0).contains(v.get_ref()) => Ok(*v.get_ref()),
        Some(v) => Err(Diagnostic::at(
            v.span(),
            format!("{key} must be between 0 and 1, not {}", v.get_ref()),
        )),
    }
}

impl Faces {
    /// YuNet's input for `image`: padded right and below to a multiple of 32, BGR 0..255; with
    /// the padded width and height.
    fn blob(image: &Mat) -> opencv::Result<(Mat, usize, usize)> {
        let (width, height) = (image.cols(), image.rows());
        let pad = |n: i32| (n + 31) / 32 * 32;
        let mut padded = Mat::default();
        core::copy_make_border(
            image,
            &mut padded,
            0,
            pad(height) - height,
            0,
            pad(width) - width,
            core::BORDER_CONSTANT,
            Scalar::default(),
        )?;
        let blob = dnn::blob_from_image_def(&padded)?;
        Ok((blob, pad(width) as usize, pad(height) as usize))
    }

    /// The network's outputs for a padded input of `width` x `height` -> faces, after
    /// non-maximum suppression.
    fn found(
        &self,
        outputs: &[Tensor],
        width: usize,
        height: usize,
    ) -> Result<Vec<Detection>, StepError> {
        let values: Vec<&[f32]> = outputs.iter().map(|t| t.data.as_slice()).collect();
        let faces = decode(&values, width, height, self.confidence).map_err(StepError::Other)?;
        let boxes: Vector<Rect> = faces
            .iter()
            .map(|f| {
                let b = f.bbox;
                Rect::new(b.x as i32, b.y as i32, b.width as i32, b.height as i32)
            })
            .collect();
        let scores: Vector<f32> = faces.iter().map(|f| f.confidence).collect();
        let mut keep = Vector::<i32>::new();
        dnn::nms_boxes_def(&boxes, &scores, self.confidence, self.nms_iou, &mut keep)?;
        Ok(keep
            .iter()
            .filter_map(|i| faces.get(usize::try_from(i).ok()?))
            .map(|f| Detection {
                class: self.class.clone(),
                ..f.clone()
            })
            .collect())
    }
}

impl Step for FaceDetection {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image_as(0, 3)?;
        let (blob, width, height) = Faces::blob(&image)?;
        let outputs = self.network.engine.forward(&blob)?;
        let detections = self.faces.found(&outputs, width, height)?;
        Ok(StepOutput::Values(vec![Value::Detections(
            detections.into(),
        )]))
    }
}

/// Decodes YuNet's outputs (in the order of [`OUTPUTS`]) for an input of `width` x `height`
/// (multiples of 32): faces scoring at least `threshold`, before suppression, class "face".
fn decode(
    outputs: &[&[f32]],
    width: usize,
    height: usize,
    threshold: f32,
) -> Result<Vec<Detection>, String> {
    if outputs.len() != OUTPUTS.len() {
        return Err(format!("yunet gave {} outputs, not 12", outputs.len()));
    }
    let mut faces = Vec::new();
    for (i, stride) in STRIDES.into_iter().enumerate() {
        let (columns, rows) = (width / stride, height / stride);
        let cells = columns * rows;
        let [cls, obj, bbox, kps] = [0, 1, 2, 3].map(|k| outputs[i + 3 * k]);
        for (name, output, per_cell) in [
            ("cls", cls, 1),
            ("obj", obj, 1),
            ("bbox", bbox, 4),
            ("kps", kps, 10),
        ] {
            if output.len() != cells * per_cell {
                return Err(format!(
                    "yunet output {name}_{stride} has {} values, not {} for a {width}x{height} input",
                    output.len(),
                    cells * per_cell
                ));
            }
        }
        let s = stride as f32;
        for idx in 0..cells {
            let score = (cls[idx].clamp(0.0, 1.0) * obj[idx].clamp(0.0, 1.0)).sqrt();
            if score < threshold {
                continue;
            }
            let (c, r) = ((idx % columns) as f32, (idx / columns) as f32);
            let b = &bbox[idx * 4..idx * 4 + 4];
            let (cx, cy) = ((c + b[0]) * s, (r + b[1]) * s);
            let (w, h) = (b[2].exp() * s, b[3].exp() * s);
            let k = &kps[idx * 10..idx * 10 + 10];
            let landmarks = k
                .chunks_exact(2)
                .map(|p| [(p[0] + c) * s, (p[1] + r) * s])
                .collect();
            faces.push(Detection {
                landmarks: Some(landmarks),
                ..Detection::new(
                    "face".into(),
                    score,
                    BBox {
                        x: cx - w / 2.0,
                        y: cy - h / 2.0,
                        width: w,
                        height: h,
                    },
                )
            });
        }
    }
    Ok(faces)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outputs for a 64x32 input (stride 8: 8x4 cells, 16: 4x2, 32: 2x1), all scores zero.
    fn empty() -> Vec<Vec<f32>> {
        let cells = [32, 8, 2];
        let per_cell = [1, 1, 4, 10];
        (0..12)
            .map(|i| vec![0.0; cells[i % 3] * per_cell[i / 3]])
            .collect()
    }

    #[test]
    fn a_face_is_decoded_from_its_cell_and_stride() {
        let mut out = empty();
        // Stride 16 (index 1), line 1, column 2 -> cell 1 * 4 + 2 = 6.
        out[1][6] = 0.81; // cls
        out[4][6] = 1.0; // obj: score sqrt(0.81) = 0.9
        out[7][24..28].copy_from_slice(&[0.5, 0.5, 0.0, 1f32.ln()]); // bbox
        out[10][60..70].copy_from_slice(&[0.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0]);
        let refs: Vec<&[f32]> = out.iter().map(Vec::as_slice).collect();
        let faces = decode(&refs, 64, 32, 0.6).unwrap();
        assert_eq!(faces.len(), 1);
        let f = &faces[0];
        assert!((f.confidence - 0.9).abs() < 1e-6);
        // Centre ((2 + 0.5) * 16, (1 + 0.5) * 16) = (40, 24), size 16 x 16.
        assert_eq!(
            f.bbox,
            BBox {
                x: 32.0,
                y: 16.0,
                width: 16.0,
                height: 16.0
            }
        );
        assert_eq!(
            f.landmarks.as_deref(),
            Some(
                &[
                    [32.0, 16.0],
                    [48.0, 16.0],
                    [40.0, 24.0],
                    [32.0, 32.0],
                    [48.0, 32.0]
                ][..]
            )
        );
    }

    #[test]
    fn scores_below_the_threshold_and_clamped_values_are_dropped() {
        let mut out = empty();
        out[0][0] = 0.5;
        out[3][0] = 0.5; // sqrt(0.25) = 0.5 < 0.6
        out[2][0] = 4.0;
        out[5][0] = -1.0; // clamped to 0
        let refs: Vec<&[f32]> = out.iter().map(Vec::as_slice).collect();
        assert!(decode(&refs, 64, 32, 0.6).unwrap().is_empty());
    }

    #[test]
    fn outputs_of_the_wrong_size_are_errors() {
        let out = empty();
        let refs: Vec<&[f32]> = out.iter().map(Vec::as_slice).collect();
        let err = decode(&refs, 64, 64, 0.6).unwrap_err();
        assert!(err.contains("cls_8 has 32 values, not 64"), "{err}");
        assert!(decode(&refs[..11], 64, 32, 0.6).is_err());
    }
}
