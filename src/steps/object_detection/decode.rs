//! Output decoders of the YOLO layouts: rows of a network's output -> candidate boxes in pixels
//! of the image the step was given, before non-maximum suppression.
//!
//! Every layout gives rows of `4 + 1 + classes` values: a box, an objectness and one score per
//! class. They differ in what the numbers mean:
//! - `darknet` (a Darknet `[yolo]` head read by OpenCV): `cx, cy, w, h` as fractions of the
//!   input, hence of the image (the input is the image resized without letterbox); class scores
//!   already multiplied by the objectness.
//! - `yolov5` (Ultralytics ONNX export): `cx, cy, w, h` in input pixels; score = objectness x
//!   class probability.
//! - `yolox` (Megvii ONNX export, decoding not baked in): rows follow the grids of strides 8, 16
//!   and 32 over the input, row-major; `cx = (x + column) * stride`, `w = exp(w) * stride`;
//!   score = objectness x class probability.
//! - `yolov8` (Ultralytics YOLOv8, YOLO11 and YOLOv12 ONNX exports): one output `[1, 4 + classes,
//!   candidates]` (transposed: a candidate is a column), `cx, cy, w, h` in input pixels, no
//!   objectness; score = the class score. OpenCV 4.6 cannot read these networks; ONNX Runtime
//!   and OpenVINO can.
//!
//! An output's shape must be its layout's for the step's class count ([`fits`]): the step checks
//! it when the model is loaded (a wrong layout or class list is a `validate` error), and every
//! frame's decoding checks it again. A score or box value that is not a number (NaN) is never a
//! detection.

use crate::value::BBox;

/// How a model's outputs are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    Darknet,
    Yolov5,
    Yolox,
    Yolov8,
}

impl Layout {
    pub(super) const NAMES: &'static str = "\"darknet\", \"yolov5\", \"yolox\" or \"yolov8\"";

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Darknet => "darknet",
            Self::Yolov5 => "yolov5",
            Self::Yolox => "yolox",
            Self::Yolov8 => "yolov8",
        }
    }

    /// The shape of an output of this layout for `classes` classes, as messages write it.
    fn expected(self, classes: usize) -> String {
        match self {
            Self::Yolov8 => format!("[1, {}, candidates]", 4 + classes),
            Self::Darknet | Self::Yolov5 | Self::Yolox => {
                format!("[1, rows, {}] or [rows, {}]", 5 + classes, 5 + classes)
            }
        }
    }

    pub(super) fn parse(name: &str) -> Option<Self> {
        match name {
            "darknet" => Some(Self::Darknet),
            "yolov5" => Some(Self::Yolov5),
            "yolox" => Some(Self::Yolox),
            "yolov8" => Some(Self::Yolov8),
            _ => None,
        }
    }
}

/// YOLOX's output strides, in the order of its rows.
const YOLOX_STRIDES: [usize; 3] = [8, 16, 32];

/// Sizes that map the network's coordinates to the image's.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    pub(super) image_width: f32,
    pub(super) image_height: f32,
    /// Input of the network, pixels: width and height (equal unless `keep_aspect`).
    pub(super) input_width: usize,
    pub(super) input_height: usize,
}

impl Geometry {
    /// A candidate whose centre and size are fractions of the input (= of the image).
    fn candidate(self, class: usize, score: f32, [cx, cy, w, h]: [f32; 4]) -> Candidate {
        let (iw, ih) = (self.image_width, self.image_height);
        Candidate {
            class,
            score,
            bbox: BBox {
                x: (cx - w / 2.0) * iw,
                y: (cy - h / 2.0) * ih,
                width: w * iw,
                height: h * ih,
            },
        }
    }
}

/// A box before non-maximum suppression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Candidate {
    pub(super) class: usize,
    pub(super) score: f32,
    pub(super) bbox: BBox,
}

/// Why an output cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    #[error(
        "its output of shape {shape:?} is not the {layout} layout for {classes} classes ({expected}): a wrong layout or class names?"
    )]
    Shape {
        shape: Vec<usize>,
        layout: &'static str,
        classes: usize,
        expected: String,
    },
    #[error("yolox output has {rows} rows; an input of {width}x{height} pixels gives {expected}")]
    YoloxRows {
        rows: usize,
        width: usize,
        height: usize,
        expected: usize,
    },
}

/// Whether an output of `shape` is of `layout` for `classes` classes: rows of `5 + classes`
/// (`[1, rows, 5 + classes]`, or `[rows, 5 + classes]` as OpenCV gives a Darknet head), or
/// YOLOv8's `[1, 4 + classes, candidates]`; `values` of them.
pub(super) fn fits(
    layout: Layout,
    shape: &[usize],
    values: usize,
    classes: usize,
) -> Result<(), DecodeError> {
    let ok = match (layout, shape) {
        (Layout::Yolov8, [1, lines, n]) => *lines == 4 + classes && *n > 0,
        (Layout::Yolov8, _) => false,
        (_, [1, rows, row] | [rows, row]) => *row == 5 + classes && *rows > 0,
        _ => false,
    };
    if ok && shape.iter().product::<usize>() == values {
        Ok(())
    } else {
        Err(DecodeError::Shape {
            shape: shape.to_vec(),
            layout: layout.name(),
            classes,
            expected: layout.expected(classes),
        })
    }
}

/// Decodes one output tensor (its shape, its values in order) into `out`: rows whose best
/// wanted class scores at least `threshold`. `wanted[class]` says whether a class is kept at
/// all.
#[expect(
    clippy::too_many_arguments,
    reason = "the decoder's inputs, each needed"
)]
pub(super) fn decode(
    layout: Layout,
    shape: &[usize],
    values: &[f32],
    classes: usize,
    wanted: &[bool],
    threshold: f32,
    geometry: Geometry,
    out: &mut Vec<Candidate>,
) -> Result<(), DecodeError> {
    fits(layout, shape, values.len(), classes)?;
    if layout == Layout::Yolov8 {
        decode_yolov8(values, classes, wanted, threshold, geometry, out);
        return Ok(());
    }
    let row = 5 + classes;
    let rows = values.len() / row;
    let grid = match layout {
        Layout::Yolox => Some(yolox_grid(rows, geometry)?),
        Layout::Darknet | Layout::Yolov5 | Layout::Yolov8 => None,
    };
    let (iw, ih) = (geometry.input_width as f32, geometry.input_height as f32);
    let wanted: Vec<usize> = (0..classes)
        .filter(|c| wanted.get(*c).copied().unwrap_or(false))
        .collect();
    for (i, r) in values.chunks_exact(row).enumerate() {
        let Some((class, class_score)) = best_class(&r[5..], &wanted) else {
            continue;
        };
        let score = match layout {
            Layout::Darknet => class_score,
            Layout::Yolov5 | Layout::Yolox | Layout::Yolov8 => r[4] * class_score,
        };
        // A NaN compares false with everything: it must not pass as "not below".
        if score.is_nan() || score < threshold {
            continue;
        }
        // Centre and size as fractions of the input (= of the image).
        let (cx, cy, w, h) = match (layout, &grid) {
            (Layout::Darknet, _) => (r[0], r[1], r[2], r[3]),
            (Layout::Yolox, Some(grid)) => {
                let (column, line, stride) = grid[i];
                (
                    (r[0] + column) * stride / iw,
                    (r[1] + line) * stride / ih,
                    r[2].exp() * stride / iw,
                    r[3].exp() * stride / ih,
                )
            }
            (Layout::Yolov5 | Layout::Yolox | Layout::Yolov8, _) => {
                (r[0] / iw, r[1] / ih, r[2] / iw, r[3] / ih)
            }
        };
        push_finite(out, geometry.candidate(class, score, [cx, cy, w, h]));
    }
    Ok(())
}

/// Adds a candidate whose box is made of numbers (a NaN box would be `null` in the JSON).
fn push_finite(out: &mut Vec<Candidate>, c: Candidate) {
    let b = c.bbox;
    if [b.x, b.y, b.width, b.height, c.score]
        .iter()
        .all(|v| v.is_finite())
    {
        out.push(c);
    }
}

/// YOLOv8's transposed output (its shape checked): line `k` holds value `k` of every candidate.
fn decode_yolov8(
    values: &[f32],
    classes: usize,
    wanted: &[bool],
    threshold: f32,
    geometry: Geometry,
    out: &mut Vec<Candidate>,
) {
    let lines = 4 + classes;
    let n = values.len() / lines;
    let line = |k: usize| &values[k * n..(k + 1) * n];
    // Each candidate's best wanted class, the first of equal scores: the wanted classes' lines
    // are read one after another, front to back (a candidate's scores are 4 x 8400 bytes apart
    // at 640: read candidate by candidate, every score is a cache miss).
    let mut wanted_classes = (0..classes).filter(|c| wanted.get(*c).copied().unwrap_or(false));
    let Some(first) = wanted_classes.next() else {
        return;
    };
    // A NaN score is no class's: below every number.
    let mut best_score: Vec<f32> = line(4 + first)
        .iter()
        .map(|s| if s.is_nan() { f32::NEG_INFINITY } else { *s })
        .collect();
    let mut best_class = vec![first; n];
    for class in wanted_classes {
        for ((score, best), best_class) in line(4 + class)
            .iter()
            .zip(best_score.iter_mut())
            .zip(best_class.iter_mut())
        {
            if *score > *best {
                (*best, *best_class) = (*score, class);
            }
        }
    }
    let input = [geometry.input_width, geometry.input_height].map(|side| side as f32);
    for (i, (&score, &class)) in best_score.iter().zip(&best_class).enumerate() {
        if score >= threshold {
            let [cx, cy, w, h] = [0, 1, 2, 3].map(|k| values[k * n + i] / input[k % 2]);
            push_finite(out, geometry.candidate(class, score, [cx, cy, w, h]));
        }
    }
}

/// The best-scoring of the `wanted` classes (ascending) of a row (a NaN score is no class's).
fn best_class(scores: &[f32], wanted: &[usize]) -> Option<(usize, f32)> {
    wanted
        .iter()
        .filter_map(|&c| Some((c, *scores.get(c)?)))
        .filter(|(_, s)| !s.is_nan())
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// Column, line and stride of every YOLOX row, in row order.
fn yolox_grid(rows: usize, geometry: Geometry) -> Result<Vec<(f32, f32, f32)>, DecodeError> {
    let mut grid = Vec::with_capacity(rows);
    for stride in YOLOX_STRIDES {
        for line in 0..geometry.input_height / stride {
            for column in 0..geometry.input_width / stride {
                grid.push((column as f32, line as f32, stride as f32));
            }
        }
    }
    if grid.len() != rows {
        return Err(DecodeError::YoloxRows {
            rows,
            width: geometry.input_width,
            height: geometry.input_height,
            expected: grid.len(),
        });
    }
    Ok(grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEOMETRY: Geometry = Geometry {
        image_width: 800.0,
        image_height: 400.0,
        input_width: 64,
        input_height: 64,
    };

    fn close(a: BBox, b: [f32; 4]) {
        let got = [a.x, a.y, a.width, a.height];
        for (g, e) in got.iter().zip(b) {
            assert!((g - e).abs() < 1e-3, "{got:?} != {b:?}");
        }
    }

    /// Decodes an output of 3 classes (shaped as its layout's) into a fresh list.
    fn decoded(
        layout: Layout,
        values: &[f32],
        wanted: &[bool],
        min: f32,
    ) -> Result<Vec<Candidate>, DecodeError> {
        let shape = match layout {
            Layout::Yolov8 => vec![1, 7, values.len() / 7],
            _ => vec![1, values.len() / 8, 8],
        };
        let mut out = Vec::new();
        decode(layout, &shape, values, 3, wanted, min, GEOMETRY, &mut out).map(|()| out)
    }

    /// A row of 3 classes.
    fn row(b: [f32; 4], objectness: f32, scores: [f32; 3]) -> Vec<f32> {
        let mut r = b.to_vec();
        r.push(objectness);
        r.extend(scores);
        r
    }

    #[test]
    fn darknet_rows_are_fractions_of_the_image_with_scores_including_objectness() {
        let mut values = row([0.5, 0.25, 0.25, 0.5], 0.9, [0.1, 0.8, 0.0]);
        values.extend(row([0.1, 0.1, 0.1, 0.1], 0.9, [0.3, 0.2, 0.1])); // below 0.4
        let out = decoded(Layout::Darknet, &values, &[true; 3], 0.4).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].class, out[0].score), (1, 0.8));
        close(out[0].bbox, [300.0, 0.0, 200.0, 200.0]);
    }

    #[test]
    fn yolov5_rows_are_input_pixels_and_score_is_objectness_times_class() {
        let values = row([32.0, 16.0, 16.0, 32.0], 0.5, [0.9, 0.0, 0.2]);
        let out = decoded(Layout::Yolov5, &values, &[true; 3], 0.4).unwrap();
        assert_eq!((out[0].class, out[0].score), (0, 0.45));
        // 64 px input -> 800x400 image: x scales by 12.5, y by 6.25.
        close(out[0].bbox, [300.0, 0.0, 200.0, 200.0]);
        let out = decoded(Layout::Yolov5, &values, &[true; 3], 0.5).unwrap();
        assert!(out.is_empty(), "0.5 x 0.9 is below 0.5");
    }

    #[test]
    fn yolox_rows_follow_the_grids_of_strides_8_16_32() {
        // 64 px input: 8x8 + 4x4 + 2x2 = 84 rows; put one object in each stride's grid.
        let mut values = vec![0.0; 84 * 8];
        let mut set =
            |index: usize, r: Vec<f32>| values[index * 8..index * 8 + 8].copy_from_slice(&r);
        // Stride 8, line 2, column 3 (row 19): centre (3.5 * 8, 2.5 * 8) = (28, 20), size 8 x 16.
        set(19, row([0.5, 0.5, 0.0, 2f32.ln()], 1.0, [0.0, 0.0, 0.7]));
        // Stride 32, line 1, column 0 (row 64 + 16 + 2 = 82): centre (16, 48), size 32 x 32.
        set(82, row([0.5, 0.5, 0.0, 0.0], 0.8, [1.0, 0.0, 0.0]));
        let out = decoded(Layout::Yolox, &values, &[true; 3], 0.4).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].class, out[1].class), (2, 0));
        // Input pixels x 12.5 across, x 6.25 down.
        close(
            out[0].bbox,
            [(28.0 - 4.0) * 12.5, (20.0 - 8.0) * 6.25, 100.0, 100.0],
        );
        close(out[1].bbox, [0.0, 32.0 * 6.25, 400.0, 200.0]);
    }

    #[test]
    fn yolov8_candidates_are_columns_in_input_pixels_without_objectness() {
        // Two candidates (columns), 3 classes: lines cx, cy, w, h, class 0, 1, 2.
        let values = [
            32.0, 8.0, // cx
            16.0, 8.0, // cy
            16.0, 4.0, // w
            32.0, 4.0, // h
            0.1, 0.3, // class 0
            0.9, 0.2, // class 1
            0.0, 0.1, // class 2
        ];
        let out = decoded(Layout::Yolov8, &values, &[true; 3], 0.4).unwrap();
        assert_eq!(out.len(), 1, "the second column scores 0.3 at best");
        assert_eq!((out[0].class, out[0].score), (1, 0.9));
        close(out[0].bbox, [300.0, 0.0, 200.0, 200.0]);
        assert!(decoded(Layout::Yolov8, &values[..13], &[true; 3], 0.4).is_err());
    }

    /// Decodes an output of one class, of `shape`, for an input of `geometry`.
    fn decoded_one_class(
        layout: Layout,
        shape: &[usize],
        values: &[f32],
        geometry: Geometry,
    ) -> Result<Vec<Candidate>, DecodeError> {
        let mut out = Vec::new();
        decode(layout, shape, values, 1, &[true], 0.4, geometry, &mut out).map(|()| out)
    }

    #[test]
    fn a_non_square_input_scales_each_axis_by_its_own_side() {
        // 64 x 32 input (keep_aspect) -> 800x400 image: x and y both scale by 12.5.
        let wide = Geometry {
            input_width: 64,
            input_height: 32,
            ..GEOMETRY
        };
        let values = [32.0, 16.0, 16.0, 16.0, 0.9];
        let out = decoded_one_class(Layout::Yolov8, &[1, 5, 1], &values, wide).unwrap();
        close(out[0].bbox, [300.0, 100.0, 200.0, 200.0]);
        // YOLOX: 64 x 32 -> 8x4 + 4x2 + 2x1 = 42 rows; stride 8, line 3, column 1 (row 25):
        // centre (12, 28) in input pixels.
        let mut values = vec![0.0; 42 * 6];
        values[25 * 6..26 * 6].copy_from_slice(&[0.5, 0.5, 0.0, 0.0, 1.0, 0.9]);
        let out = decoded_one_class(Layout::Yolox, &[1, 42, 6], &values, wide).unwrap();
        close(
            out[0].bbox,
            [(12.0 - 4.0) * 12.5, (28.0 - 4.0) * 12.5, 100.0, 100.0],
        );
        let square_rows = decoded_one_class(Layout::Yolox, &[1, 84, 6], &[0.0; 84 * 6], wide);
        assert!(matches!(
            square_rows,
            Err(DecodeError::YoloxRows {
                rows: 84,
                expected: 42,
                ..
            })
        ));
    }

    /// The candidate-by-candidate reading of the yolov8 layout that `decode_yolov8` speeds up.
    fn yolov8_one_by_one(values: &[f32], classes: usize, wanted: &[bool]) -> Vec<Candidate> {
        let n = values.len() / (4 + classes);
        let mut out = Vec::new();
        for i in 0..n {
            let mut best: Option<(usize, f32)> = None;
            for class in (0..classes).filter(|c| wanted[*c]) {
                let score = values[(4 + class) * n + i];
                if !score.is_nan() && best.is_none_or(|(_, s)| score > s) {
                    best = Some((class, score));
                }
            }
            if let Some((class, score)) = best.filter(|(_, s)| *s >= 0.4) {
                let [cx, cy, w, h] = [0, 1, 2, 3].map(|k| values[k * n + i] / 64.0);
                out.push(GEOMETRY.candidate(class, score, [cx, cy, w, h]));
            }
        }
        out
    }

    #[test]
    fn yolov8_decoding_picks_what_reading_candidate_by_candidate_picks() {
        // 5 classes, 300 candidates of made-up scores: ties, NaN, unwanted best classes.
        let (classes, n) = (5, 300);
        let mut values: Vec<f32> = (0..(4 + classes) * n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
            .collect();
        for i in (0..n).step_by(17) {
            values[(4 + 2) * n + i] = f32::NAN;
            values[(4 + 1) * n + i] = values[(4 + 3) * n + i];
        }
        for wanted in [
            [true; 5],
            [false, true, false, true, false],
            [false, false, true, false, false],
            [false; 5],
        ] {
            let mut out = Vec::new();
            decode(
                Layout::Yolov8,
                &[1, 4 + classes, n],
                &values,
                classes,
                &wanted,
                0.4,
                GEOMETRY,
                &mut out,
            )
            .unwrap();
            let want = yolov8_one_by_one(&values, classes, &wanted);
            assert!(!want.is_empty() || wanted == [false; 5]);
            assert_eq!(out, want, "{wanted:?}");
        }
    }

    #[test]
    fn a_nan_score_or_box_is_never_a_detection() {
        let nan = f32::NAN;
        for layout in [Layout::Darknet, Layout::Yolov5, Layout::Yolox] {
            let mut values = Vec::new();
            if layout == Layout::Yolox {
                // 84 rows at 64 px: pad with empty rows.
                values = vec![0.0; 81 * 8];
            }
            // A NaN objectness (Darknet reads only the class scores, which hold it: a NaN class
            // score there).
            values.extend(if layout == Layout::Darknet {
                row([0.5, 0.5, 0.1, 0.1], 0.9, [nan, 0.0, 0.0])
            } else {
                row([0.5, 0.5, 0.1, 0.1], nan, [0.9, 0.0, 0.0])
            });
            values.extend(row([0.5, 0.5, 0.1, 0.1], 1.0, [nan, 0.0, 0.0])); // class score
            values.extend(row([nan, 0.5, 0.1, 0.1], 1.0, [0.9, 0.0, 0.0])); // box
            let out = decoded(layout, &values, &[true; 3], 0.4).unwrap();
            assert!(out.is_empty(), "{layout:?}: {out:?}");
            // A NaN beside a real score: the real one is the detection.
            let good = row([0.5, 0.5, 0.1, 0.1], 1.0, [nan, 0.8, 0.0]);
            let mut values = values[..values.len() - 8].to_vec();
            values.extend(good);
            let out = decoded(layout, &values, &[true; 3], 0.4).unwrap();
            assert_eq!(out.len(), 1, "{layout:?}: {out:?}");
            assert_eq!(out[0].class, 1);
        }
        // YOLOv8 columns: a NaN score, a NaN box.
        let values = [
            32.0, nan, // cx
            16.0, 16.0, // cy
            16.0, 16.0, // w
            32.0, 32.0, // h
            nan, 0.9, // class 0
            0.0, 0.0, // class 1
            0.0, 0.0, // class 2
        ];
        assert!(
            decoded(Layout::Yolov8, &values, &[true; 3], 0.4)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn unwanted_classes_never_come_out() {
        let values = row([0.5, 0.5, 0.1, 0.1], 1.0, [0.9, 0.5, 0.0]);
        let wanted = [false, true, false];
        let out = decoded(Layout::Darknet, &values, &wanted, 0.4).unwrap();
        assert_eq!(
            (out[0].class, out[0].score),
            (1, 0.5),
            "best wanted class, not best"
        );
        let out = decoded(Layout::Darknet, &values, &[false; 3], 0.0).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn outputs_of_the_wrong_shape_are_errors() {
        let mut out = Vec::new();
        let mut shaped = |layout, shape: &[usize]| {
            let values = vec![0.0; shape.iter().product()];
            decode(
                layout, shape, &values, 3, &[true; 3], 0.4, GEOMETRY, &mut out,
            )
        };
        // Rows of 8 for 3 classes, in both shapes OpenCV and ONNX give them.
        assert!(shaped(Layout::Darknet, &[5, 8]).is_ok());
        assert!(shaped(Layout::Darknet, &[1, 5, 8]).is_ok());
        assert!(shaped(Layout::Yolov8, &[1, 7, 5]).is_ok());
        // A real YOLOv8 export with 2 classes ([1, 6, 8400]) read with 3 names: its 50400
        // values are 7 lines of 7200 too, but not its shape.
        let e = shaped(Layout::Yolov8, &[1, 6, 8400]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "its output of shape [1, 6, 8400] is not the yolov8 layout for 3 classes ([1, 7, candidates]): a wrong layout or class names?"
        );
        // A YOLOv8 output read as rows, rows read as YOLOv8, and 4 classes' rows.
        assert!(shaped(Layout::Yolov5, &[1, 7, 8400]).is_err());
        assert!(shaped(Layout::Yolov8, &[1, 8400, 8]).is_err());
        assert!(shaped(Layout::Darknet, &[1, 5, 9]).is_err());
        assert!(shaped(Layout::Yolox, &[2, 5, 8]).is_err());
        // The shape and the values disagree.
        assert!(fits(Layout::Darknet, &[5, 8], 39, 3).is_err());
        let err = decoded(Layout::Yolox, &[0.0; 80], &[true; 3], 0.4);
        assert!(matches!(
            err,
            Err(DecodeError::YoloxRows {
                rows: 10,
                expected: 84,
                ..
            })
        ));
    }
}
