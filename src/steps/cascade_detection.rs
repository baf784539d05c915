//! `cascade_detection`: objects found by an OpenCV Haar or LBP cascade classifier (any cascade
//! XML, e.g. /usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml from Debian's
//! `opencv-data`). The file is read when the pipeline is loaded: a missing or unreadable cascade
//! is a `validate` error.
//!
//! Threads: one classifier per worker that runs the step at the same moment ([`Instances`]),
//! made lazily and reused for every frame.

use std::path::PathBuf;
use std::sync::Arc;

use opencv::core::{Rect, Size, Vector};
use opencv::objdetect::{CascadeClassifier, CascadeClassifierTrait, CascadeClassifierTraitConst};
use serde::Deserialize;
use toml::Spanned;

use super::common::instances::Instances;
use super::{DETECTIONS_OUT, IMAGE_IN, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Detection, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "cascade_detection",
    summary: "objects found by a Haar or LBP cascade classifier (any cascade XML)",
    inputs: IMAGE_IN,
    outputs: DETECTIONS_OUT,
    params: &[
        ParamDoc {
            name: "path",
            ty: "path",
            default: "required",
            doc: "the cascade XML (e.g. /usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml)",
        },
        ParamDoc {
            name: "class",
            ty: "string",
            default: "\"object\"",
            doc: "class name given to the detections",
        },
        ParamDoc {
            name: "scale_factor",
            ty: "float in (1, 2]",
            default: "1.1",
            doc: "step between the image scales searched (more than 1)",
        },
        ParamDoc {
            name: "min_neighbors",
            ty: "integer",
            default: "3",
            doc: "overlapping hits needed to report an object (more: fewer false ones)",
        },
        ParamDoc {
            name: "min_size",
            ty: "integer",
            default: "0",
            doc: "smallest object side, pixels (0: the cascade's window)",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: Spanned<PathBuf>,
    class: Option<String>,
    scale_factor: Option<Spanned<f64>>,
    min_neighbors: Option<Spanned<i32>>,
    min_size: Option<Spanned<i32>>,
}

#[derive(Debug)]
struct CascadeDetection {
    classifiers: Instances<CascadeClassifier>,
    class: Arc<str>,
    scale_factor: f64,
    min_neighbors: i32,
    min_size: i32,
}

fn read(path: &std::path::Path) -> opencv::Result<CascadeClassifier> {
    let classifier = CascadeClassifier::new(path)?;
    if classifier.empty()? {
        return Err(opencv::Error::new(
            opencv::core::StsError,
            "not a cascade classifier",
        ));
    }
    Ok(classifier)
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let path = c.path.get_ref().clone();
    if !path.is_file() {
        return Err(Diagnostic::at(
            c.path.span(),
            format!("no cascade file {}", path.display()),
        ));
    }
    let classifier = read(&path).map_err(|e| {
        Diagnostic::at(
            c.path.span(),
            format!("opencv cannot read cascade {}: {e}", path.display()),
        )
    })?;
    let scale_factor = match c.scale_factor {
        Some(s) if !(*s.get_ref() > 1.0 && *s.get_ref() <= 2.0) => {
            return Err(Diagnostic::at(
                s.span(),
                format!(
                    "scale_factor must be above 1 and at most 2, not {}",
                    s.get_ref()
                ),
            ));
        }
        Some(s) => s.into_inner(),
        None => 1.1,
    };
    let non_negative = |key: &str, v: Option<Spanned<i32>>, default: i32| match v {
        Some(v) if *v.get_ref() < 0 => Err(Diagnostic::at(
            v.span(),
            format!("{key} must not be negative, not {}", v.get_ref()),
        )),
        Some(v) => Ok(v.into_inner()),
        None => Ok(default),
    };
    Ok(Box::new(CascadeDetection {
        classifiers: Instances::new(classifier, move || read(&path)),
        class: c.class.unwrap_or_else(|| "object".to_owned()).into(),
        scale_factor,
        min_neighbors: non_negative("min_neighbors", c.min_neighbors, 3)?,
        min_size: non_negative("min_size", c.min_size, 0)?,
    }))
}

impl Step for CascadeDetection {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image_as(0, 1)?;
        let image = &*image;
        let mut found = Vector::<Rect>::new();
        self.classifiers.with(|classifier| {
            classifier.detect_multi_scale(
                image,
                &mut found,
                self.scale_factor,
                self.min_neighbors,
                0,
                Size::new(self.min_size, self.min_size),
                Size::new(0, 0),
            )?;
            Ok(())
        })?;
        let detections: Vec<Detection> = found
            .iter()
            .map(|r| Detection::new(self.class.clone(), 1.0, BBox::from(r)))
            .collect();
        Ok(StepOutput::Values(vec![Value::Detections(
            detections.into(),
        )]))
    }
}
