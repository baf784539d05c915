//! What an object looks like: the colours of the upper and lower half of its box, to tell two
//! objects apart where their boxes alone cannot (two people passing behind each other, one
//! found again after it was hidden).
//!
//! Each half is a histogram of [`BINS`] colour classes over the middle of the box (the sides
//! are mostly background, the top is the head, the bottom the ground): 8 hues, each in 3
//! brightnesses and 3 saturations (greys, with no hue, fall in the first hue's classes, kept
//! apart by brightness and saturation). Coarse classes keep the histogram stable under the
//! light changing over a scene, while dark and light clothes stay apart. Two histograms are
//! compared by their Bhattacharyya coefficient (1: the same colours, 0: none in common), the
//! two halves averaged.

use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, Rect};

use crate::frame::Frame;
use crate::value::BBox;

/// Colour classes of one half: 8 hues x 3 brightnesses x 3 saturations.
const BINS: usize = 72;
/// Pixels looked at per half at most: more add little to a 72-class histogram.
const SAMPLES: i32 = 600;
/// The part of the box used, as fractions of its width and height: the middle half across,
/// from just below the head to just above the feet.
const ACROSS: (f32, f32) = (0.25, 0.75);
const DOWN: (f32, f32) = (0.1, 0.9);
/// The smallest box side (pixels) whose colours are worth reading.
const MIN_SIDE: f32 = 8.0;

/// The colours of one box: two normalised histograms (upper half, lower half).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Colours {
    halves: [[f32; BINS]; 2],
}

impl Colours {
    /// The colours of `bbox` on `frame`, or `None` for a box too small or outside it. Only the
    /// box's middle is converted to BGR.
    pub(super) fn of(frame: &Frame, bbox: &BBox) -> Option<Self> {
        let (width, height) = (frame.width(), frame.height());
        if bbox.width < MIN_SIDE || bbox.height < MIN_SIDE {
            return None;
        }
        let x0 = (bbox.x + ACROSS.0 * bbox.width).max(0.0) as i32;
        let x1 = ((bbox.x + ACROSS.1 * bbox.width) as i32).min(width);
        let y0 = (bbox.y + DOWN.0 * bbox.height).max(0.0) as i32;
        let y1 = ((bbox.y + DOWN.1 * bbox.height) as i32).min(height);
        if x1 - x0 < 2 || y1 - y0 < 2 {
            return None;
        }
        let pixels = frame.bgr_region(Rect::new(x0, y0, x1 - x0, y1 - y0)).ok()?;
        Self::of_bgr(&pixels)
    }

    /// The colours of a whole BGR image (the box's middle, cut out).
    fn of_bgr(pixels: &Mat) -> Option<Self> {
        let (cols, rows) = (pixels.cols(), pixels.rows());
        let middle = rows / 2;
        let upper = histogram(pixels, 0, middle, cols)?;
        let lower = histogram(pixels, middle, rows, cols)?;
        Some(Self {
            halves: [upper, lower],
        })
    }

    /// Colours all of one class in both halves (for tests of the tracker).
    #[cfg(test)]
    pub(super) fn solid(class: usize) -> Self {
        let mut half = [0.0; BINS];
        half[class % BINS] = 1.0;
        Self {
            halves: [half, half],
        }
    }

    /// How alike two boxes' colours are, from 0 (nothing in common) to 1 (the same).
    pub(super) fn similarity(&self, other: &Self) -> f32 {
        let coefficient = |a: &[f32; BINS], b: &[f32; BINS]| -> f32 {
            a.iter().zip(b).map(|(p, q)| (p * q).sqrt()).sum()
        };
        let [a0, a1] = &self.halves;
        let [b0, b1] = &other.halves;
        ((coefficient(a0, b0) + coefficient(a1, b1)) / 2.0).min(1.0)
    }

    /// Moves these colours towards `seen`: `keep` of the old, `1 - keep` of the new.
    pub(super) fn blend(&mut self, seen: &Self, keep: f32) {
        for (mine, new) in self.halves.iter_mut().zip(&seen.halves) {
            for (m, n) in mine.iter_mut().zip(new) {
                *m = keep * *m + (1.0 - keep) * n;
            }
        }
    }
}

/// The normalised colour-class histogram of rows `top..bottom` of a BGR image `cols` wide,
/// sampled on a grid of at most [`SAMPLES`] pixels; `None` when it has no pixel.
fn histogram(pixels: &Mat, top: i32, bottom: i32, cols: i32) -> Option<[f32; BINS]> {
    let area = (bottom - top) * cols;
    if area <= 0 {
        return None;
    }
    let step = ((area as f32 / SAMPLES as f32).sqrt().ceil() as i32).max(1);
    let mut bins = [0.0f32; BINS];
    let mut n = 0.0f32;
    for y in (top..bottom).step_by(step as usize) {
        let Ok(row) = pixels.at_row::<opencv::core::Vec3b>(y) else {
            continue;
        };
        for p in row.iter().step_by(step as usize) {
            bins[class(p[0], p[1], p[2])] += 1.0;
            n += 1.0;
        }
    }
    if n == 0.0 {
        return None;
    }
    for b in &mut bins {
        *b /= n;
    }
    Some(bins)
}

/// The colour class of a BGR pixel: `hue * 9 + brightness * 3 + saturation` (each third of
/// its range; hue in eighths of the circle, 0 for greys).
fn class(b: u8, g: u8, r: u8) -> usize {
    let (b, g, r) = (i32::from(b), i32::from(g), i32::from(r));
    let max = b.max(g).max(r);
    let min = b.min(g).min(r);
    let chroma = max - min;
    let v = (max * 3 / 256) as usize;
    let s = if max == 0 {
        0
    } else {
        (chroma * 3 / (max + 1)) as usize
    };
    if chroma == 0 {
        return v * 3 + s;
    }
    // Hue in sixths of the circle, 0 to 6, as HSV defines it.
    let c = chroma as f32;
    let sixths = if max == r {
        ((g - b) as f32 / c).rem_euclid(6.0)
    } else if max == g {
        (b - r) as f32 / c + 2.0
    } else {
        (r - g) as f32 / c + 4.0
    };
    ((sixths / 6.0 * 8.0) as usize).min(7) * 9 + v * 3 + s
}

#[cfg(test)]
mod tests {
    use super::*;
    use opencv::core::{CV_8UC3, MatTrait, Scalar};

    /// A `w` x `h` image: `top` colour (BGR) in its upper half, `bottom` in the lower.
    fn person(w: i32, h: i32, top: [f64; 3], bottom: [f64; 3]) -> Mat {
        let mut m = Mat::new_rows_cols_with_default(h, w, CV_8UC3, Scalar::default()).unwrap();
        let upper = Rect::new(0, 0, w, h / 2);
        let lower = Rect::new(0, h / 2, w, h - h / 2);
        for (rect, c) in [(upper, top), (lower, bottom)] {
            let mut part = Mat::roi_mut(&mut m, rect).unwrap();
            part.set_to_def(&Scalar::new(c[0], c[1], c[2], 0.0))
                .unwrap();
        }
        m
    }

    const RED: [f64; 3] = [30.0, 30.0, 200.0];
    const BLUE: [f64; 3] = [200.0, 60.0, 30.0];
    const BLACK: [f64; 3] = [20.0, 20.0, 20.0];
    const WHITE: [f64; 3] = [230.0, 230.0, 230.0];

    #[test]
    fn the_same_clothes_are_alike_and_others_are_not() {
        let a = Colours::of_bgr(&person(30, 80, RED, BLUE)).unwrap();
        let a_again = Colours::of_bgr(&person(24, 70, RED, BLUE)).unwrap();
        let swapped = Colours::of_bgr(&person(30, 80, BLUE, RED)).unwrap();
        let dark = Colours::of_bgr(&person(30, 80, BLACK, BLACK)).unwrap();
        let light = Colours::of_bgr(&person(30, 80, WHITE, WHITE)).unwrap();
        assert!(a.similarity(&a_again) > 0.99, "{}", a.similarity(&a_again));
        assert!(a.similarity(&swapped) < 0.01);
        assert!(dark.similarity(&light) < 0.01);
        assert!(a.similarity(&dark) < 0.01);
    }

    #[test]
    fn blending_moves_part_of_the_way() {
        let mut a = Colours::of_bgr(&person(30, 80, RED, RED)).unwrap();
        let b = Colours::of_bgr(&person(30, 80, BLUE, BLUE)).unwrap();
        a.blend(&b, 0.75);
        let s = a.similarity(&b);
        assert!((s - 0.5).abs() < 0.01, "{s}");
    }

    #[test]
    fn classes_tell_hues_brightness_and_saturation_apart() {
        // Black, a mid grey and white: hue 0, brightness 0, 1, 2, saturation 0.
        assert_eq!(class(10, 10, 10), 0);
        assert_eq!(class(128, 128, 128), 3);
        assert_eq!(class(250, 250, 250), 6);
        // Pure red, green and blue (BGR): bright, saturated, hues 0, 2 and 5 of 8.
        assert_eq!(class(0, 0, 255), 8);
        assert_eq!(class(0, 255, 0), 2 * 9 + 8);
        assert_eq!(class(255, 0, 0), 5 * 9 + 8);
        // A dark, pale red: brightness 0, saturation 1.
        assert_eq!(class(40, 40, 70), 1);
        assert!(
            (0..=255)
                .step_by(15)
                .all(|v| class(v, 255 - v, v / 2) < BINS)
        );
    }
}
