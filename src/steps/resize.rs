//! `resize`: scales an image to a fixed size.
//!
//! Scaling the decoded frame down scales its YUV planes and converts only the result to BGR
//! (see `Frame::bgr_resized`): much cheaper than converting every pixel first.

use opencv::core::{Mat, Size};
use opencv::imgproc;
use serde::Deserialize;

use super::{IMAGE_IN, IMAGE_OUT, Placement, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Image, Value};

pub(super) static KIND: StepKind = StepKind {
    name: "resize",
    summary: "scale the image to width x height (bilinear)",
    inputs: IMAGE_IN,
    outputs: IMAGE_OUT,
    params: &[
        ParamDoc {
            name: "width",
            ty: "integer in [1, 16384]",
            default: "required",
            doc: "output width in pixels",
        },
        ParamDoc {
            name: "height",
            ty: "integer in [1, 16384]",
            default: "required",
            doc: "output height in pixels",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    width: toml::Spanned<u32>,
    height: toml::Spanned<u32>,
}

#[derive(Debug)]
struct Resize {
    size: Size,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let width = dimension("width", &c.width)?;
    let height = dimension("height", &c.height)?;
    Ok(Box::new(Resize {
        size: Size::new(width, height),
    }))
}

fn dimension(key: &str, v: &toml::Spanned<u32>) -> Result<i32, Diagnostic> {
    match i32::try_from(*v.get_ref()) {
        Ok(n) if (1..=16384).contains(&n) => Ok(n),
        _ => Err(Diagnostic::at(
            v.span(),
            format!("{key} must be between 1 and 16384, not {}", v.get_ref()),
        )),
    }
}

impl Step for Resize {
    fn placement(&self) -> Placement {
        Placement::Scaled {
            width: self.size.width,
            height: self.size.height,
        }
    }

    fn image_size(&self) -> Option<(u32, u32)> {
        let side = |v: i32| u32::try_from(v).ok();
        Some((side(self.size.width)?, side(self.size.height)?))
    }

    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        if let Some(Some(Value::Image(Image::Frame(frame)))) = input.values.first() {
            let out = frame
                .bgr_resized(self.size, imgproc::INTER_LINEAR)
                .map_err(StepError::Frame)?;
            return Ok(StepOutput::Values(vec![Value::Image(out.into())]));
        }
        let mut out = Mat::default();
        imgproc::resize(
            input.image(0)?,
            &mut out,
            self.size,
            0.0,
            0.0,
            imgproc::INTER_LINEAR,
        )?;
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opencv::core::{MatTraitConst, Size};

    use super::*;
    use crate::frame::Frame;
    use crate::frame::test_video::decoded;

    #[test]
    fn scaling_the_decoded_frame_down_never_converts_all_of_it() {
        let (buffer, info) = decoded("video/x-raw,format=I420,width=720,height=528");
        let frame = Arc::new(Frame::from_buffer("cam".into(), 0, buffer, &info).unwrap());
        let step = Resize {
            size: Size::new(321, 175),
        };
        let values = [Some(Value::Image(Image::Frame(frame.clone())))];
        let out = step
            .run(&StepInput {
                frame: &frame,
                values: &values,
            })
            .unwrap();
        let StepOutput::Values(out) = out else {
            panic!("no output")
        };
        let image = out[0].get::<Image>().unwrap().mat().unwrap();
        assert_eq!(
            (image.cols(), image.rows(), image.channels()),
            (321, 175, 3)
        );
        assert!(!frame.has_bgr(), "the whole frame was converted");
    }
}
