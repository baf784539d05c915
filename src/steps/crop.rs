//! `crop`: a fixed rectangle of the image (a region of interest).
//!
//! A crop of the decoded frame converts only the YUV pixels inside the rectangle to BGR (see
//! `Frame::bgr_region`), not the whole frame.

use opencv::core::{Mat, MatTraitConst, Rect};
use serde::Deserialize;

use super::{IMAGE_IN, IMAGE_OUT, Placement, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Image, Value};

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
            ty: "integer >= 1",
            default: "required",
            doc: "width in pixels",
        },
        ParamDoc {
            name: "height",
            ty: "integer >= 1",
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
    fn placement(&self) -> Placement {
        let r = self.rect;
        Placement::Cut {
            x: r.x,
            y: r.y,
            width: r.width,
            height: r.height,
        }
    }

    fn image_size(&self) -> Option<(u32, u32)> {
        let side = |v: i32| u32::try_from(v).ok();
        Some((side(self.rect.width)?, side(self.rect.height)?))
    }

    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let r = self.rect;
        let (cols, rows, _) = input.get::<Image>(0)?.shape();
        if r.x + r.width > cols || r.y + r.height > rows {
            return Err(StepError::Other(format!(
                "crop {}x{} at ({}, {}) does not fit the {}x{} image",
                r.width, r.height, r.x, r.y, cols, rows
            )));
        }
        if let Some(Some(Value::Image(Image::Frame(frame)))) = input.values.first() {
            let out = frame.bgr_region(r).map_err(StepError::Frame)?;
            return Ok(StepOutput::Values(vec![Value::Image(out.into())]));
        }
        let mut out = Mat::default();
        Mat::roi(input.image(0)?, r)?.copy_to(&mut out)?;
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opencv::core::MatTraitConstManual;

    use super::*;
    use crate::frame::Frame;
    use crate::frame::test_video::decoded;

    #[test]
    fn a_crop_of_the_decoded_frame_converts_only_its_rectangle() {
        let (buffer, info) = decoded("video/x-raw,format=NV12,width=720,height=528");
        let frame = Arc::new(Frame::from_buffer("cam".into(), 0, buffer.clone(), &info).unwrap());
        let rect = Rect::new(33, 17, 101, 55);
        let values = [Some(Value::Image(Image::Frame(frame.clone())))];
        let out = Crop { rect }
            .run(&StepInput {
                frame: &frame,
                values: &values,
            })
            .unwrap();
        let StepOutput::Values(out) = out else {
            panic!("no output")
        };
        assert!(!frame.has_bgr(), "the whole frame was converted");
        let plain = Frame::from_buffer("cam".into(), 0, buffer, &info).unwrap();
        let plain = Mat::roi(plain.bgr().unwrap(), rect)
            .unwrap()
            .try_clone()
            .unwrap();
        let image = out[0].get::<Image>().unwrap().mat().unwrap();
        assert_eq!(image.data_bytes().unwrap(), plain.data_bytes().unwrap());

        // A rectangle that does not fit fails the frame with the sizes in the message.
        let err = Crop {
            rect: Rect::new(700, 0, 21, 1),
        }
        .run(&StepInput {
            frame: &frame,
            values: &values,
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "crop 21x1 at (700, 0) does not fit the 720x528 image"
        );
    }
}
