//! `crop`: a fixed rectangle of the image (a region of interest).

use opencv::core::{Mat, MatTraitConst, Rect};
use serde::Deserialize;

use super::{IMAGE_IN, IMAGE_OUT, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::Value;

pub(super) static KIND: StepKind = StepKind {
    name: "crop",
    summary: "cut a fixed rectangle out of the image; fails the frame if it does not fit",
    inputs: IMAGE_IN,
    outputs: IMAGE_OUT,
    params: &[
        ParamDoc {
            name: "x",
            ty: "integer",
            default: "0",
            doc: "left edge in pixels",
        },
        ParamDoc {
            name: "y",
            ty: "integer",
            default: "0",
            doc: "top edge in pixels",
        },
        ParamDoc {
            name: "width",
            ty: "integer",
            default: "required",
            doc: "width in pixels",
        },
        ParamDoc {
            name: "height",
            ty: "integer",
            default: "required",
            doc: "height in pixels",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    x: Option<u16>,
    y: Option<u16>,
    width: toml::Spanned<u16>,
    height: toml::Spanned<u16>,
}

#[derive(Debug)]
struct Crop {
    rect: Rect,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    for (key, v) in [("width", &c.width), ("height", &c.height)] {
        if *v.get_ref() == 0 {
            return Err(Diagnostic::at(
                v.span(),
                format!("{key} must be at least 1"),
            ));
        }
    }
    Ok(Box::new(Crop {
        rect: Rect::new(
            i32::from(c.x.unwrap_or(0)),
            i32::from(c.y.unwrap_or(0)),
            i32::from(*c.width.get_ref()),
            i32::from(*c.height.get_ref()),
        ),
    }))
}

impl Step for Crop {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let r = self.rect;
        if r.x + r.width > image.cols() || r.y + r.height > image.rows() {
            return Err(StepError::Other(format!(
                "crop {}x{} at ({}, {}) does not fit the {}x{} image",
                r.width,
                r.height,
                r.x,
                r.y,
                image.cols(),
                image.rows()
            )));
        }
        let mut out = Mat::default();
        Mat::roi(image, r)?.copy_to(&mut out)?;
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}
