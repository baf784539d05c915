//! `blur_regions`: privacy blur (or pixelation) of the boxes of detections and tracks (faces,
//! licence plates). The image is copied once; only the boxes' rectangles are processed, each
//! with the pixels around it untouched. Tracks are blurred whether seen or only predicted on
//! the frame: a face the detector missed for a frame stays hidden.

use opencv::core::{self, Mat, MatTraitConst, Rect, Size};
use opencv::imgproc;
use serde::Deserialize;

use super::{IMAGE_OUT, Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Detection, Track, Value, ValueType};

const INPUTS: &[Port] = &[
    Port {
        name: "image",
        ty: ValueType::Image,
        optional: false,
    },
    Port {
        name: "detections",
        ty: ValueType::Detections,
        optional: true,
    },
    Port {
        name: "tracks",
        ty: ValueType::Tracks,
        optional: true,
    },
];

/// Default `strength`: a kernel (or block) a third of the region's shorter side leaves a face
/// unrecognisable.
const DEFAULT_STRENGTH: f64 = 0.33;

pub(super) static KIND: StepKind = StepKind {
    name: "blur_regions",
    summary: "blur or pixelate the boxes of detections and/or tracks (faces, plates); the rest of the image is untouched",
    inputs: INPUTS,
    outputs: IMAGE_OUT,
    params: &[
        ParamDoc {
            name: "method",
            ty: "\"blur\" | \"pixelate\"",
            default: "\"blur\"",
            doc: "Gaussian blur, or blocks of one colour",
        },
        ParamDoc {
            name: "strength",
            ty: "float in (0, 1]",
            default: "0.33",
            doc: "blur kernel, or block side, as a fraction of the region's shorter side",
        },
        ParamDoc {
            name: "padding",
            ty: "float >= 0",
            default: "0.0",
            doc: "added on every side of a box, as a fraction of its width (left, right) and height (top, bottom)",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Method {
    Blur,
    Pixelate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    method: Option<Method>,
    strength: Option<toml::Spanned<f64>>,
    padding: Option<toml::Spanned<f64>>,
}

#[derive(Debug)]
struct BlurRegions {
    method: Method,
    strength: f64,
    padding: f64,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    params.require_one_input(&["detections", "tracks"])?;
    let c: Config = params.parse()?;
    let strength = match c.strength {
        Some(s) if !(*s.get_ref() > 0.0 && *s.get_ref() <= 1.0) => {
            return Err(Diagnostic::at(
                s.span(),
                format!(
                    "strength must be above 0 and at most 1, not {}",
                    s.get_ref()
                ),
            ));
        }
        Some(s) => s.into_inner(),
        None => DEFAULT_STRENGTH,
    };
    let padding = match c.padding {
        Some(p) if !(p.get_ref().is_finite() && *p.get_ref() >= 0.0) => {
            return Err(Diagnostic::at(
                p.span(),
                format!("padding must be a number >= 0, not {}", p.get_ref()),
            ));
        }
        Some(p) => p.into_inner(),
        None => 0.0,
    };
    Ok(Box::new(BlurRegions {
        method: c.method.unwrap_or(Method::Blur),
        strength,
        padding,
    }))
}

impl BlurRegions {
    /// The box grown by `padding` and cut to the image; `None` when nothing of it is left.
    fn region(&self, b: &BBox, width: i32, height: i32) -> Option<Rect> {
        let (px, py) = (
            f64::from(b.width) * self.padding,
            f64::from(b.height) * self.padding,
        );
        let x0 = (f64::from(b.x) - px).floor().max(0.0);
        let y0 = (f64::from(b.y) - py).floor().max(0.0);
        let x1 = (f64::from(b.x + b.width) + px).ceil().min(f64::from(width));
        let y1 = (f64::from(b.y + b.height) + py)
            .ceil()
            .min(f64::from(height));
        #[expect(
            clippy::cast_possible_truncation,
            reason = "clamped to the image size above"
        )]
        let rect = Rect::new(x0 as i32, y0 as i32, (x1 - x0) as i32, (y1 - y0) as i32);
        (rect.width > 0 && rect.height > 0).then_some(rect)
    }

    /// Blurs or pixelates `rect` of `image` in place.
    fn obscure(&self, image: &mut Mat, rect: Rect) -> Result<(), StepError> {
        let side = f64::from(rect.width.min(rect.height));
        #[expect(
            clippy::cast_possible_truncation,
            reason = "at most the region's side, an i32"
        )]
        let size = (side * self.strength).round().max(1.0) as i32;
        let mut roi = Mat::roi_mut(image, rect)?;
        let mut done = Mat::default();
        match self.method {
            Method::Blur => {
                // An odd kernel of at least 3; pixels outside the region are not read.
                let k = (size | 1).max(3);
                imgproc::gaussian_blur(
                    &roi,
                    &mut done,
                    Size::new(k, k),
                    0.0,
                    0.0,
                    core::BORDER_REFLECT_101 | core::BORDER_ISOLATED,
                )?;
            }
            Method::Pixelate => {
                let block = size.max(2);
                let small = Size::new(
                    (rect.width + block - 1) / block,
                    (rect.height + block - 1) / block,
                );
                let mut shrunk = Mat::default();
                imgproc::resize(&roi, &mut shrunk, small, 0.0, 0.0, imgproc::INTER_AREA)?;
                imgproc::resize(
                    &shrunk,
                    &mut done,
                    rect.size(),
                    0.0,
                    0.0,
                    imgproc::INTER_NEAREST,
                )?;
            }
        }
        done.copy_to(&mut roi)?;
        Ok(())
    }
}

impl Step for BlurRegions {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let detections = input.optional::<[Detection]>(1)?.unwrap_or_default();
        let tracks = input.optional::<[Track]>(2)?.unwrap_or_default();
        let boxes = detections
            .iter()
            .map(|d| &d.bbox)
            .chain(tracks.iter().map(|t| &t.detection.bbox));
        let (width, height) = (image.cols(), image.rows());
        let mut out = image.try_clone()?;
        for b in boxes {
            if let Some(rect) = self.region(b, width, height) {
                self.obscure(&mut out, rect)?;
            }
        }
        Ok(StepOutput::Values(vec![Value::Image(out.into())]))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opencv::core::{CV_8UC3, Scalar, Vec3b};
    use opencv::prelude::*;

    use super::*;
    use crate::frame::Frame;

    /// A 1-pixel checkerboard of black and white: any blur or pixelation changes every pixel.
    fn checkerboard(width: i32, height: i32) -> Mat {
        let mut m =
            Mat::new_rows_cols_with_default(height, width, CV_8UC3, Scalar::all(0.0)).unwrap();
        for y in 0..height {
            for x in 0..width {
                if (x + y) % 2 == 0 {
                    *m.at_2d_mut::<Vec3b>(y, x).unwrap() = Vec3b::from([255, 255, 255]);
                }
            }
        }
        m
    }

    fn bbox(x: f32, y: f32, width: f32, height: f32) -> BBox {
        BBox {
            x,
            y,
            width,
            height,
        }
    }

    /// Runs a step of `params` on a checkerboard with these detections and tracks; gives the
    /// input and output images.
    fn run(params: &str, detections: &[BBox], tracks: &[BBox]) -> (Mat, Mat) {
        let step = build(
            Params::from_toml(params).with_inputs(vec!["image", "detections", "tracks"], 0..0),
        )
        .unwrap();
        let image = checkerboard(64, 48);
        let frame = Frame::from_mat("cam".into(), 0, None, image.clone());
        let detections: Vec<Detection> = detections
            .iter()
            .map(|&b| Detection::new("face".into(), 0.9, b))
            .collect();
        let tracks: Vec<Track> = tracks
            .iter()
            .map(|&b| Track {
                track_id: 1,
                detection: Detection::new("face".into(), 0.9, b),
                predicted: true,
                ground: None,
                speed: None,
                dwell: None,
            })
            .collect();
        let values = [
            Some(Value::Image(crate::value::Image::Frame(Arc::new(frame)))),
            Some(Value::Detections(detections.into())),
            Some(Value::Tracks(tracks.into())),
        ];
        let frame = Frame::from_mat("cam".into(), 0, None, Mat::default());
        let StepOutput::Values(out) = step
            .run(&StepInput {
                frame: &frame,
                values: &values,
            })
            .unwrap()
        else {
            panic!("no image")
        };
        let out = out[0]
            .get::<crate::value::Image>()
            .unwrap()
            .mat()
            .unwrap()
            .clone();
        (image, out)
    }

    /// Whether each pixel changed, row by row.
    fn changed(a: &Mat, b: &Mat) -> Vec<Vec<bool>> {
        let (a, b) = (a.data_bytes().unwrap(), b.data_bytes().unwrap());
        let width = 64 * 3;
        a.chunks(width)
            .zip(b.chunks(width))
            .map(|(ra, rb)| {
                ra.chunks(3)
                    .zip(rb.chunks(3))
                    .map(|(pa, pb)| pa != pb)
                    .collect()
            })
            .collect()
    }

    /// The pixels of `rects` (x, y, w, h): exactly these changed, every other one is identical.
    fn assert_only(changed: &[Vec<bool>], rects: &[(usize, usize, usize, usize)]) {
        for (y, row) in changed.iter().enumerate() {
            for (x, &c) in row.iter().enumerate() {
                let inside = rects
                    .iter()
                    .any(|&(rx, ry, w, h)| x >= rx && x < rx + w && y >= ry && y < ry + h);
                assert_eq!(
                    c, inside,
                    "pixel ({x}, {y}) changed: {c}, in a region: {inside}"
                );
            }
        }
    }

    #[test]
    fn blur_changes_the_boxes_and_nothing_else() {
        let (input, out) = run(
            "",
            &[bbox(4.0, 6.0, 12.0, 10.0)],
            &[bbox(40.0, 20.0, 16.0, 20.0)],
        );
        assert_only(&changed(&input, &out), &[(4, 6, 12, 10), (40, 20, 16, 20)]);
    }

    #[test]
    fn pixelate_with_padding_changes_the_grown_boxes_and_nothing_else() {
        // Padding 0.25 of a 16x8 box: 4 px left and right, 2 px above and below.
        let (input, out) = run(
            "method = \"pixelate\"\npadding = 0.25",
            &[bbox(20.0, 10.0, 16.0, 8.0), bbox(58.0, 40.0, 10.0, 10.0)],
            &[],
        );
        // The second box runs off the image: cut at its edges.
        assert_only(&changed(&input, &out), &[(16, 8, 24, 12), (55, 37, 9, 11)]);
    }

    #[test]
    fn no_regions_leave_the_image_as_it_was() {
        let (input, out) = run("", &[], &[]);
        assert_only(&changed(&input, &out), &[]);
    }

    #[test]
    fn it_needs_detections_or_tracks_and_a_sane_strength() {
        let err = build(Params::from_toml("").with_inputs(vec!["image"], 3..9)).unwrap_err();
        assert_eq!(err.span, Some(3..9));
        assert!(
            err.message.contains("\"detections\", \"tracks\""),
            "{err:?}"
        );
        let err =
            build(Params::from_toml("strength = 0").with_inputs(vec!["image", "tracks"], 0..0))
                .unwrap_err();
        assert!(err.message.contains("strength must be above 0"), "{err:?}");
    }
}
