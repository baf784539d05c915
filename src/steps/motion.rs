//! `motion`: MOG2 background subtraction; each moving region becomes a detection.
//!
//! The background model is state carried from frame to frame, one model per source, so the
//! kind is declared stateful: the executor hands it the frames of a source in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use opencv::core::{Mat, Point, Ptr, Size, Vector};
use opencv::imgproc;
use opencv::video::{self, BackgroundSubtractorMOG2};
use serde::Deserialize;

use super::{DETECTIONS_OUT, IMAGE_IN, Step, StepError, StepInput, StepKind, StepOutput};
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
            ty: "integer",
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
    /// One background model per source, each behind its own lock. The map's lock is held only
    /// to find (or add) a source's model, never while a model runs, so sources do not queue
    /// behind each other; the executor never runs this step for two frames of one source at
    /// once, so a model's own lock is uncontended.
    models: Mutex<HashMap<Arc<str>, Arc<Mutex<Model>>>>,
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
        models: Mutex::new(HashMap::new()),
    }))
}

type Model = Ptr<BackgroundSubtractorMOG2>;

impl Motion {
    /// The background model of `source`, made on its first frame.
    fn model(&self, source: &Arc<str>) -> Result<Arc<Mutex<Model>>, StepError> {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(model) = models.get(source) {
            return Ok(model.clone());
        }
        let model = Arc::new(Mutex::new(video::create_background_subtractor_mog2(
            self.history,
            self.var_threshold,
            true,
        )?));
        models.insert(source.clone(), model.clone());
        Ok(model)
    }
}

impl Step for Motion {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let mut mask = Mat::default();
        let model = self.model(&input.frame.source)?;
        {
            let mut model = model.lock().unwrap_or_else(PoisonError::into_inner);
            video::BackgroundSubtractorTrait::apply(&mut *model, image, &mut mask, -1.0)?;
        }
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
}
