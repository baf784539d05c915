//! `grayscale`: BGR to single-channel luminance.

use opencv::core::{Mat, MatTraitConst};
use opencv::imgproc;
use serde::Deserialize;

use super::{IMAGE_IN, IMAGE_OUT, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, Params};
use crate::value::{Image, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "grayscale",
    summary: "convert the image to one channel of luminance",
    inputs: IMAGE_IN,
    outputs: IMAGE_OUT,
    params: &[],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {}

#[derive(Debug)]
struct Grayscale;

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let Config {} = params.parse()?;
    Ok(Box::new(Grayscale))
}

impl Step for Grayscale {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        // The decoded frame's luma plane is already grey: no conversion, no copy.
        if let Some(Some(Value::Image(Image::Frame(frame)))) = input.values.first()
            && frame.luma().is_some()
        {
            return Ok(StepOutput::Values(vec![Value::Image(Image::Luma(
                frame.clone(),
            ))]));
        }
        let image = input.image(0)?;
        if image.channels() == 1 {
            return Ok(StepOutput::Values(vec![Value::Image(
                input.get::<Image>(0)?.clone(),
            )]));
        }
        let mut out = Mat::default();
        imgproc::cvt_color_def(image, &mut out, imgproc::COLOR_BGR2GRAY)?;
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}
