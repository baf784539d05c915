//! `annotate`: draws detections (box and label) on a copy of an image.

use opencv::core::{Mat, MatTraitConst, Point, Rect, Scalar};
use opencv::imgproc;
use serde::Deserialize;

use super::{Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Value, ValueType};

pub(super) static KIND: StepKind = StepKind {
    name: "annotate",
    summary: "draw boxes and labels of detections on a copy of the image",
    inputs: &[
        Port {
            name: "image",
            ty: ValueType::Image,
            optional: false,
        },
        Port {
            name: "detections",
            ty: ValueType::Detections,
            optional: false,
        },
    ],
    outputs: super::IMAGE_OUT,
    params: &[
        ParamDoc {
            name: "color",
            ty: "[b, g, r]",
            default: "[0, 255, 0]",
            doc: "box and label colour",
        },
        ParamDoc {
            name: "thickness",
            ty: "integer",
            default: "2",
            doc: "line width in pixels",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    color: Option<[u8; 3]>,
    thickness: Option<toml::Spanned<i32>>,
}

#[derive(Debug)]
struct Annotate {
    color: Scalar,
    thickness: i32,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let [b, g, r] = c.color.unwrap_or([0, 255, 0]);
    let thickness = match c.thickness {
        Some(t) if !(1..=50).contains(t.get_ref()) => {
            return Err(Diagnostic::at(
                t.span(),
                "thickness must be between 1 and 50",
            ));
        }
        Some(t) => t.into_inner(),
        None => 2,
    };
    Ok(Box::new(Annotate {
        color: Scalar::new(f64::from(b), f64::from(g), f64::from(r), 0.0),
        thickness,
    }))
}

impl Step for Annotate {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let detections = input.detections(1)?;
        let mut canvas = Mat::default();
        if image.channels() == 1 {
            imgproc::cvt_color_def(image, &mut canvas, imgproc::COLOR_GRAY2BGR)?;
        } else {
            image.copy_to(&mut canvas)?;
        }
        for d in detections {
            let b = d.bbox;
            let rect = Rect::new(b.x as i32, b.y as i32, b.width as i32, b.height as i32);
            imgproc::rectangle(
                &mut canvas,
                rect,
                self.color,
                self.thickness,
                imgproc::LINE_8,
                0,
            )?;
            let label = format!("{} {:.2}", d.class, d.confidence);
            let origin = Point::new(rect.x, (rect.y - 4).max(12));
            imgproc::put_text_def(
                &mut canvas,
                &label,
                origin,
                imgproc::FONT_HERSHEY_SIMPLEX,
                0.45,
                self.color,
            )?;
        }
        Ok(StepOutput::Values(vec![Value::Image(canvas.into())]))
    }
}
