//! `motion`: MOG2 background subtraction; each moving region becomes a detection.
//!
//! The background model is state carried from frame to frame, one model per source
//! ([`PerSource`]), so the kind is declared stateful: the executor hands it the frames of a
//! source in order. After a panic on a frame of a source, the executor drops that source's
//! model ([`Step::reset_source`]): it learns the background again from the next frame. So it
//! does when the source's frames change size ([`Step::source_resized`]): a model of the old
//! size says nothing about the new picture.

use std::sync::Arc;

use opencv::core::{Mat, Point, Ptr, Size, Vector};
use opencv::imgproc;
use opencv::video::{self, BackgroundSubtractorMOG2};
use serde::Deserialize;

use super::common::per_source::PerSource;
use super::{DETECTIONS_OUT, IMAGE_IN, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::Format;
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Detection, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "motion",
    summary: "moving regions by MOG2 background subtraction (state per source)",
    inputs: IMAGE_IN,
    outputs: DETECTIONS_OUT,
    params: &[
        ParamDoc {
            name: "history",
            ty: "integer >= 1",
            default: "500",
            doc: "frames that shape the background model",
        },
        ParamDoc {
            name: "var_threshold",
            ty: "float",
            default: "16.0",
            doc: "squared distance above which a pixel is foreground",
        },
        ParamDoc {
            name: "min_area",
            ty: "float",
            default: "400.0",
            doc: "smallest region reported, in square pixels",
        },
        ParamDoc {
            name: "class",
            ty: "string",
            default: "\"motion\"",
            doc: "class name given to the detections",
        },
    ],
    stateful: true,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    history: Option<toml::Spanned<i32>>,
    var_threshold: Option<f64>,
    min_area: Option<f64>,
    class: Option<String>,
}

#[derive(Debug)]
struct Motion {
    history: i32,
    var_threshold: f64,
    min_area: f64,
    class: Arc<str>,
    kernel: Mat,
    /// One background model per source, made on its first frame.
    models: PerSource<Model>,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let history = match c.history {
        Some(h) if *h.get_ref() < 1 => {
            return Err(Diagnostic::at(h.span(), "history must be at least 1"));
        }
        Some(h) => h.into_inner(),
        None => 500,
    };
    let kernel = imgproc::get_structuring_element_def(imgproc::MORPH_ELLIPSE, Size::new(3, 3))
        .map_err(|e| Diagnostic::new(format!("opencv: {e}")))?;
    Ok(Box::new(Motion {
        history,
        var_threshold: c.var_threshold.unwrap_or(16.0),
        min_area: c.min_area.unwrap_or(400.0),
        class: c.class.unwrap_or_else(|| "motion".to_owned()).into(),
        kernel,
        models: PerSource::default(),
    }))
}

type Model = Ptr<BackgroundSubtractorMOG2>;

impl Step for Motion {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let mut mask = Mat::default();
        let make =
            || video::create_background_subtractor_mog2(self.history, self.var_threshold, true);
        self.models.with_made(&input.frame.source, make, |model| {
            video::BackgroundSubtractorTrait::apply(model, image, &mut mask, -1.0)
        })??;
        // Shadows are marked 127 by MOG2: keep only confident foreground (255).
        let mut binary = Mat::default();
        imgproc::threshold(&mask, &mut binary, 200.0, 255.0, imgproc::THRESH_BINARY)?;
        let mut cleaned = Mat::default();
        imgproc::morphology_ex_def(&binary, &mut cleaned, imgproc::MORPH_OPEN, &self.kernel)?;
        let mut grown = Mat::default();
        imgproc::dilate_def(&cleaned, &mut grown, &self.kernel)?;
        let mut contours = Vector::<Vector<Point>>::new();
        imgproc::find_contours_def(
            &grown,
            &mut contours,
            imgproc::RETR_EXTERNAL,
            imgproc::CHAIN_APPROX_SIMPLE,
        )?;
        let mut detections = Vec::new();
        for contour in &contours {
            let area = imgproc::contour_area_def(&contour)?;
            if area < self.min_area {
                continue;
            }
            let r = imgproc::bounding_rect(&contour)?;
            detections.push(Detection::new(self.class.clone(), 1.0, BBox::from(r)));
        }
        Ok(StepOutput::Values(vec![Value::Detections(
            detections.into(),
        )]))
    }

    fn reset_source(&self, source: &str) -> bool {
        self.models.reset(source);
        true
    }

    fn source_resized(&self, source: &str, _from: Format, _to: Format) -> Option<String> {
        self.models.reset(source);
        Some(
            "its background model restarts (no motion is found until it has learnt the new \
             picture)"
                .to_owned(),
        )
    }
}
