//! `people_detection`: upright people by OpenCV's built-in HOG + linear SVM people detector
//! (Dalal-Triggs, 64x128 window). No model file: the detector ships inside OpenCV.
//!
//! Threads: one HOG descriptor per worker that runs the step at the same moment
//! ([`Instances`]), made lazily and reused for every frame.

use std::sync::Arc;

use opencv::core::{Rect, Size, Vector};
use opencv::objdetect::{HOGDescriptor, HOGDescriptorTrait, HOGDescriptorTraitConst};
use serde::Deserialize;
use toml::Spanned;

use super::common::instances::Instances;
use super::{DETECTIONS_OUT, IMAGE_IN, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Detection, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "people_detection",
    summary: "upright people by OpenCV's built-in HOG people detector (no model file)",
    inputs: IMAGE_IN,
    outputs: DETECTIONS_OUT,
    params: &[
        ParamDoc {
            name: "scale",
            ty: "float in (1, 2]",
            default: "1.05",
            doc: "step between the image scales searched (more than 1; larger is faster)",
        },
        ParamDoc {
            name: "win_stride",
            ty: "integer",
            default: "8",
            doc: "step of the detection window, pixels (a multiple of 8)",
        },
        ParamDoc {
            name: "hit_threshold",
            ty: "float",
            default: "0.0",
            doc: "lowest SVM score of a window (raise it for fewer false people)",
        },
        ParamDoc {
            name: "class",
            ty: "string",
            default: "\"person\"",
            doc: "class name given to the detections",
        },
    ],
    stateful: false,
    build,
};

/// Windows a person must be found in, around one place, to be reported.
const GROUP_THRESHOLD: f64 = 2.0;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    scale: Option<Spanned<f64>>,
    win_stride: Option<Spanned<i32>>,
    hit_threshold: Option<f64>,
    class: Option<String>,
}

#[derive(Debug)]
struct PeopleDetection {
    hogs: Instances<HOGDescriptor>,
    scale: f64,
    win_stride: i32,
    hit_threshold: f64,
    class: Arc<str>,
}

fn people_detector() -> opencv::Result<HOGDescriptor> {
    let mut hog = HOGDescriptor::default()?;
    hog.set_svm_detector(HOGDescriptor::get_default_people_detector()?);
    Ok(hog)
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let scale = match c.scale {
        Some(s) if !(*s.get_ref() > 1.0 && *s.get_ref() <= 2.0) => {
            return Err(Diagnostic::at(
                s.span(),
                format!("scale must be above 1 and at most 2, not {}", s.get_ref()),
            ));
        }
        Some(s) => s.into_inner(),
        None => 1.05,
    };
    let win_stride = match c.win_stride {
        Some(s) if *s.get_ref() < 8 || *s.get_ref() % 8 != 0 => {
            return Err(Diagnostic::at(
                s.span(),
                format!("win_stride must be a multiple of 8, not {}", s.get_ref()),
            ));
        }
        Some(s) => s.into_inner(),
        None => 8,
    };
    let hog = people_detector().map_err(|e| Diagnostic::new(format!("opencv: {e}")))?;
    Ok(Box::new(PeopleDetection {
        hogs: Instances::new(hog, people_detector),
        scale,
        win_stride,
        hit_threshold: c.hit_threshold.unwrap_or(0.0),
        class: c.class.unwrap_or_else(|| "person".to_owned()).into(),
    }))
}

impl Step for PeopleDetection {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image_as(0, 1)?;
        let image = &*image;
        let mut found = Vector::<Rect>::new();
        let mut weights = Vector::<f64>::new();
        self.hogs.with(|hog| {
            hog.detect_multi_scale_weights(
                image,
                &mut found,
                &mut weights,
                self.hit_threshold,
                Size::new(self.win_stride, self.win_stride),
                Size::new(0, 0),
                self.scale,
                GROUP_THRESHOLD,
                false,
            )?;
            Ok(())
        })?;
        let detections: Vec<Detection> = found
            .iter()
            .zip(weights.iter().chain(std::iter::repeat(1.0)))
            .map(|(r, w)| {
                Detection::new(
                    self.class.clone(),
                    // The SVM margin, squashed into 0..1 (0 margin -> 0.5).
                    (1.0 / (1.0 + (-w).exp())) as f32,
                    BBox::from(r),
                )
            })
            .collect();
        Ok(StepOutput::Values(vec![Value::Detections(
            detections.into(),
        )]))
    }
}
