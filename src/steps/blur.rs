//! `blur`: Gaussian blur.

use opencv::core::{Mat, Size};
use opencv::imgproc;
use serde::Deserialize;

use super::{IMAGE_IN, IMAGE_OUT, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::Value;

pub(super) static KIND: StepKind = StepKind {
    name: "blur",
    summary: "Gaussian blur with an odd square kernel",
    inputs: IMAGE_IN,
    outputs: IMAGE_OUT,
    params: &[ParamDoc {
        name: "kernel",
        ty: "odd integer in [1, 255]",
        default: "5",
        doc: "kernel side in pixels",
    }],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    kernel: Option<toml::Spanned<u32>>,
}

#[derive(Debug)]
struct Blur {
    kernel: i32,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let kernel = match c.kernel {
        None => 5,
        Some(k) => match i32::try_from(*k.get_ref()) {
            Ok(n) if n % 2 == 1 && n <= 255 => n,
            _ => {
                return Err(Diagnostic::at(
                    k.span(),
                    format!("kernel must be odd and at most 255, not {}", k.get_ref()),
                ));
            }
        },
    };
    Ok(Box::new(Blur { kernel }))
}

impl Step for Blur {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let mut out = Mat::default();
        let k = Size::new(self.kernel, self.kernel);
        imgproc::gaussian_blur_def(input.image(0)?, &mut out, k, 0.0)?;
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}
