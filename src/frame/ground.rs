//! A camera's ground calibration: where a pixel of its picture lies on the ground, in metres.
//!
//! Four or more points of the picture with their places on the ground give a homography (a
//! plane seen through a pinhole camera is a projective map of the picture). It is fitted by
//! the normalised direct linear transform (Hartley & Zisserman, algorithm 4.2, with the last
//! entry fixed to 1 and least squares over the points), in `f64`: four points are met exactly,
//! more are fitted and their residual reported. One scale per pixel, never one for the whole
//! picture: a metre far from the camera is a few pixels, near it a hundred.
//!
//! The points are pixels of a picture of `size`; frames of another size (a camera that came
//! back at another resolution) are scaled to it first, so the calibration stays right.

/// Why a calibration cannot be used (the message `validate` gives, after the source's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GroundError {
    #[error("needs at least 4 points (each an image point and its ground place), not {0}")]
    TooFew(usize),
    #[error(
        "has {image} image points but {ground} ground places: give one ground place per image point"
    )]
    Unpaired { image: usize, ground: usize },
    #[error("image point {index} ({x}, {y}) is outside the {width}x{height} picture of `size`")]
    OutOfFrame {
        index: usize,
        x: f64,
        y: f64,
        width: u32,
        height: u32,
    },
    #[error(
        "{what} points {a}, {b} and {c} lie on one line: spread the points over the ground, no three in a line"
    )]
    Collinear {
        what: &'static str,
        a: usize,
        b: usize,
        c: usize,
    },
    #[error("all its {what} points lie on one line: spread them over the ground")]
    AllInLine { what: &'static str },
    #[error(
        "the points do not fit one ground plane: ground place {index} is {residual_m:.2} m from where the fit of all the points puts it; check that each is paired with its own image point and measured in metres"
    )]
    Inconsistent { index: usize, residual_m: f64 },
    #[error(
        "the points put part of the ground behind the camera: check that each ground place is paired with its own image point"
    )]
    Folded,
}

/// A fitted calibration: pixels of a `size` picture to metres on the ground.
#[derive(Debug, Clone, PartialEq)]
pub struct Ground {
    /// Row-major 3x3, image (x, y, 1) to ground (X, Y, W).
    h: [f64; 9],
    /// The picture the points were read on.
    size: (u32, u32),
    /// Root mean square of the points' distances from where the fit puts them, metres.
    pub residual_m: f64,
}

/// The most a point may be off the fitted plane, metres, before the points are refused as not
/// one plane: well above a careful measurement's error (a few cm) and well below a mistyped
/// coordinate.
const MAX_RESIDUAL_M: f64 = 1.0;
/// Three points closer than this to one line (as a share of the points' spread) are in a line.
const COLLINEAR: f64 = 1e-3;

impl Ground {
    /// Fits the calibration of `image` points (pixels of a `size` picture) to `ground` places
    /// (metres).
    pub fn fit(
        size: (u32, u32),
        image: &[[f64; 2]],
        ground: &[[f64; 2]],
    ) -> Result<Self, GroundError> {
        if image.len() != ground.len() {
            return Err(GroundError::Unpaired {
                image: image.len(),
                ground: ground.len(),
            });
        }
        if image.len() < 4 {
            return Err(GroundError::TooFew(image.len()));
        }
        let (width, height) = size;
        for (index, &[x, y]) in image.iter().enumerate() {
            if !(0.0..=f64::from(width)).contains(&x) || !(0.0..=f64::from(height)).contains(&y) {
                return Err(GroundError::OutOfFrame {
                    index: index + 1,
                    x,
                    y,
                    width,
                    height,
                });
            }
        }
        spread("image", image)?;
        spread("ground", ground)?;
        let h = fit(image, ground).ok_or(GroundError::AllInLine { what: "image" })?;
        let mut g = Self {
            h,
            size,
            residual_m: 0.0,
        };
        let mut sum = 0.0;
        for (p, q) in image.iter().zip(ground) {
            let Some(at) = g.map(*p) else {
                return Err(GroundError::Folded);
            };
            sum += (at[0] - q[0]).powi(2) + (at[1] - q[1]).powi(2);
        }
        g.residual_m = (sum / image.len() as f64).sqrt();
        let (index, worst) = image
            .iter()
            .zip(ground)
            .filter_map(|(p, q)| g.map(*p).map(|a| (a[0] - q[0]).hypot(a[1] - q[1])))
            .zip(1..)
            .fold(
                (0, 0.0),
                |(i, m), (r, j)| if r > m { (j, r) } else { (i, m) },
            );
        if worst > MAX_RESIDUAL_M {
            return Err(GroundError::Inconsistent {
                index,
                residual_m: worst,
            });
        }
        Ok(g)
    }

    /// The picture size the points were read on.
    pub fn size(&self) -> (u32, u32) {
        self.size
    }

    /// Where pixel `p` of the calibration's own picture lies on the ground (metres), or `None`
    /// above the horizon.
    fn map(&self, [x, y]: [f64; 2]) -> Option<[f64; 2]> {
        let h = &self.h;
        let w = h[6] * x + h[7] * y + h[8];
        if w <= 1e-12 {
            return None;
        }
        Some([
            (h[0] * x + h[1] * y + h[2]) / w,
            (h[3] * x + h[4] * y + h[5]) / w,
        ])
    }

    /// Where pixel `p` of a `frame` (width, height) picture lies on the ground, metres; `None`
    /// for a pixel at or above the horizon (sky, walls far away).
    pub fn to_ground(&self, p: [f32; 2], frame: (i32, i32)) -> Option<[f64; 2]> {
        let sx = f64::from(self.size.0) / f64::from(frame.0.max(1));
        let sy = f64::from(self.size.1) / f64::from(frame.1.max(1));
        self.map([f64::from(p[0]) * sx, f64::from(p[1]) * sy])
    }

    /// The inverse: the pixel of a `frame` picture that shows ground place `g` (metres).
    pub fn to_image(&self, g: [f64; 2], frame: (i32, i32)) -> Option<[f64; 2]> {
        let inv = invert3(&self.h)?;
        let w = inv[6] * g[0] + inv[7] * g[1] + inv[8];
        if w.abs() <= 1e-12 {
            return None;
        }
        let x = (inv[0] * g[0] + inv[1] * g[1] + inv[2]) / w;
        let y = (inv[3] * g[0] + inv[4] * g[1] + inv[5]) / w;
        let sx = f64::from(frame.0) / f64::from(self.size.0.max(1));
        let sy = f64::from(frame.1) / f64::from(self.size.1.max(1));
        Some([x * sx, y * sy])
    }
}

/// Refuses points all on one line, or (for exactly four) any three on one line.
fn spread(what: &'static str, points: &[[f64; 2]]) -> Result<(), GroundError> {
    let n = points.len();
    let (cx, cy) = centroid(points);
    let scale = points
        .iter()
        .map(|p| (p[0] - cx).hypot(p[1] - cy))
        .fold(0.0, f64::max);
    if scale <= 0.0 {
        return Err(GroundError::AllInLine { what });
    }
    let area = |a: usize, b: usize, c: usize| {
        let (p, q, r) = (points[a], points[b], points[c]);
        ((q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])).abs() / (scale * scale)
    };
    let mut widest: f64 = 0.0;
    for a in 0..n {
        for b in a + 1..n {
            for c in b + 1..n {
                let s = area(a, b, c);
                if n == 4 && s < COLLINEAR {
                    return Err(GroundError::Collinear {
                        what,
                        a: a + 1,
                        b: b + 1,
                        c: c + 1,
                    });
                }
                widest = widest.max(s);
            }
        }
    }
    if widest < COLLINEAR {
        return Err(GroundError::AllInLine { what });
    }
    Ok(())
}

fn centroid(points: &[[f64; 2]]) -> (f64, f64) {
    let n = points.len() as f64;
    let sx: f64 = points.iter().map(|p| p[0]).sum();
    let sy: f64 = points.iter().map(|p| p[1]).sum();
    (sx / n, sy / n)
}

/// Hartley's normalisation: centroid to the origin, mean distance sqrt(2). Row-major 3x3.
fn normaliser(points: &[[f64; 2]]) -> [f64; 9] {
    let (cx, cy) = centroid(points);
    let mean = points
        .iter()
        .map(|p| (p[0] - cx).hypot(p[1] - cy))
        .sum::<f64>()
        / points.len() as f64;
    let s = if mean > 0.0 {
        std::f64::consts::SQRT_2 / mean
    } else {
        1.0
    };
    [s, 0.0, -s * cx, 0.0, s, -s * cy, 0.0, 0.0, 1.0]
}

fn apply(t: &[f64; 9], p: [f64; 2]) -> [f64; 2] {
    [
        t[0] * p[0] + t[1] * p[1] + t[2],
        t[3] * p[0] + t[4] * p[1] + t[5],
    ]
}

/// The homography from `image` to `ground` by least squares (h33 = 1 after normalising both).
fn fit(image: &[[f64; 2]], ground: &[[f64; 2]]) -> Option<[f64; 9]> {
    let (ti, tg) = (normaliser(image), normaliser(ground));
    // Normal equations of the 2n x 8 system A h = b.
    let mut ata = [[0.0f64; 8]; 8];
    let mut atb = [0.0f64; 8];
    for (p, q) in image.iter().zip(ground) {
        let [x, y] = apply(&ti, *p);
        let [u, v] = apply(&tg, *q);
        let rows = [
            ([x, y, 1.0, 0.0, 0.0, 0.0, -u * x, -u * y], u),
            ([0.0, 0.0, 0.0, x, y, 1.0, -v * x, -v * y], v),
        ];
        for (row, rhs) in rows {
            for i in 0..8 {
                atb[i] += row[i] * rhs;
                for j in 0..8 {
                    ata[i][j] += row[i] * row[j];
                }
            }
        }
    }
    let h = solve8(ata, atb)?;
    let hn = [h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], 1.0];
    // H = Tg^-1 Hn Ti.
    let tg_inv = invert3(&tg)?;
    let mut out = mul3(&mul3(&tg_inv, &hn), &ti);
    // Scaled so that w is 1 at the image points' centroid: positive on the ground's side of
    // the horizon. (Not h33 = 1: h33 is w at the picture's corner (0, 0), which for a camera
    // that sees the horizon lies beyond it, and dividing by it would put the ground behind.)
    let (cx, cy) = centroid(image);
    let wc = out[6] * cx + out[7] * cy + out[8];
    if wc.abs() > 1e-12 {
        for v in &mut out {
            *v /= wc;
        }
    }
    Some(out)
}

/// Gaussian elimination with partial pivoting; `None` for a (near) singular system.
fn solve8(mut a: [[f64; 8]; 8], mut b: [f64; 8]) -> Option<[f64; 8]> {
    let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..8 {
        let pivot = (col..8).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= scale * 1e-10 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..8 {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (v, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *v -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0f64; 8];
    for row in (0..8).rev() {
        let s: f64 = (row + 1..8).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
}

fn mul3(a: &[f64; 9], b: &[f64; 9]) -> [f64; 9] {
    let mut out = [0.0; 9];
    for r in 0..3 {
        for c in 0..3 {
            out[r * 3 + c] = (0..3).map(|k| a[r * 3 + k] * b[k * 3 + c]).sum();
        }
    }
    out
}

fn invert3(m: &[f64; 9]) -> Option<[f64; 9]> {
    let [a, b, c, d, e, f, g, h, i] = *m;
    let det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g);
    if det.abs() < 1e-18 {
        return None;
    }
    let adj = [
        e * i - f * h,
        c * h - b * i,
        b * f - c * e,
        f * g - d * i,
        a * i - c * g,
        c * d - a * f,
        d * h - e * g,
        b * g - a * h,
        a * e - b * d,
    ];
    Some(adj.map(|v| v / det))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A camera looking down a street: a 10 m x 20 m rectangle of ground seen as a trapezoid.
    fn street() -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
        let image = vec![
            [200.0, 400.0],
            [440.0, 400.0],
            [380.0, 100.0],
            [260.0, 100.0],
        ];
        let ground = vec![[0.0, 0.0], [10.0, 0.0], [10.0, 20.0], [0.0, 20.0]];
        (image, ground)
    }

    #[test]
    fn four_points_are_met_exactly_and_the_map_inverts() {
        let (image, ground) = street();
        let g = Ground::fit((640, 480), &image, &ground).unwrap();
        for (p, q) in image.iter().zip(&ground) {
            let at = g.to_ground([p[0] as f32, p[1] as f32], (640, 480)).unwrap();
            assert!(
                (at[0] - q[0]).abs() < 1e-6 && (at[1] - q[1]).abs() < 1e-6,
                "{at:?} {q:?}"
            );
            let back = g.to_image(*q, (640, 480)).unwrap();
            assert!((back[0] - p[0]).abs() < 1e-6 && (back[1] - p[1]).abs() < 1e-6);
        }
        assert!(g.residual_m < 1e-9);
        // Far from the camera a pixel is more ground than near it.
        let near = g.to_ground([320.0, 399.0], (640, 480)).unwrap()[1]
            - g.to_ground([320.0, 400.0], (640, 480)).unwrap()[1];
        let far = g.to_ground([320.0, 100.0], (640, 480)).unwrap()[1]
            - g.to_ground([320.0, 101.0], (640, 480)).unwrap()[1];
        assert!(far > 3.0 * near, "{far} {near}");
    }

    #[test]
    fn a_camera_that_sees_the_horizon_is_calibrated_below_it() {
        // TUD-Stadtmitte's street, seen at a grazing angle: the ground is a band of the
        // picture, and its top-left corner lies beyond the horizon. Its points and places,
        // fitted from its ground truth.
        let image = [[15.0, 291.0], [628.0, 235.0], [631.0, 297.0], [23.0, 325.0]];
        let ground = [[6.68, 8.51], [16.4, 6.71], [7.49, 2.27], [3.7, 5.88]];
        let g = Ground::fit((640, 480), &image, &ground).unwrap();
        for (p, q) in image.iter().zip(&ground) {
            let at = g.to_ground([p[0] as f32, p[1] as f32], (640, 480)).unwrap();
            assert!(
                (at[0] - q[0]).abs() < 1e-6 && (at[1] - q[1]).abs() < 1e-6,
                "{at:?}"
            );
        }
        // Above the horizon there is no ground.
        assert_eq!(g.to_ground([320.0, 0.0], (640, 480)), None);
    }

    #[test]
    fn a_frame_of_another_size_is_scaled_to_the_calibration() {
        let (image, ground) = street();
        let g = Ground::fit((640, 480), &image, &ground).unwrap();
        let at = g.to_ground([400.0, 800.0], (1280, 960)).unwrap();
        assert!(at[0].abs() < 1e-6 && at[1].abs() < 1e-6, "{at:?}");
    }

    #[test]
    fn more_points_are_fitted_and_a_wrong_one_is_refused() {
        let (mut image, mut ground) = street();
        image.push([320.0, 250.0]);
        let g = Ground::fit((640, 480), &image[..4], &ground).unwrap();
        ground.push(g.to_ground([320.0, 250.0], (640, 480)).unwrap());
        let g = Ground::fit((640, 480), &image, &ground).unwrap();
        assert!(g.residual_m < 1e-6, "{}", g.residual_m);
        ground[4][1] += 5.0;
        let e = Ground::fit((640, 480), &image, &ground).unwrap_err();
        assert!(matches!(e, GroundError::Inconsistent { .. }), "{e}");
    }

    #[test]
    fn degenerate_points_are_refused_with_what_is_wrong() {
        let (image, ground) = street();
        let e = Ground::fit((640, 480), &image[..3], &ground[..3]).unwrap_err();
        assert_eq!(e, GroundError::TooFew(3));
        let e = Ground::fit((640, 480), &image, &ground[..3]).unwrap_err();
        assert!(matches!(e, GroundError::Unpaired { .. }), "{e}");
        let mut line = image.clone();
        line[2] = [320.0, 400.0];
        let e = Ground::fit((640, 480), &line, &ground).unwrap_err();
        assert_eq!(
            e,
            GroundError::Collinear {
                what: "image",
                a: 1,
                b: 2,
                c: 3
            }
        );
        let e = Ground::fit((640, 360), &image, &ground).unwrap_err();
        assert!(e.to_string().contains("outside the 640x360 picture"), "{e}");
        let mut swapped = ground.clone();
        swapped.swap(0, 1);
        let e = Ground::fit((640, 480), &image, &swapped).unwrap_err();
        assert!(
            matches!(e, GroundError::Folded | GroundError::Inconsistent { .. }),
            "{e}"
        );
    }
}
