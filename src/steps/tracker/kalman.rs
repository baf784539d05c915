//! A constant-velocity Kalman filter on a box: state `(cx, cy, w, h)` (centre, width, height)
//! and the velocity of each, as in ByteTrack and BoT-SORT's `(x, y, w, h)` variant.
//!
//! Noise is proportional to the box size (the standard deviation of a position is 1/20 of the
//! box side, of a velocity 1/160), so a filter behaves the same on a small far object as on a
//! large near one. Sizes never go below [`MIN_SIDE`] in the noise terms, so the innovation
//! covariance stays positive definite even for a degenerate box.

#![expect(
    clippy::needless_range_loop,
    reason = "matrix arithmetic reads best with row and column indices"
)]

use crate::value::BBox;

const DIM: usize = 8;
const MEASURED: usize = 4;
type Vector = [f64; DIM];
type Matrix = [[f64; DIM]; DIM];

/// Standard deviation of a measured or predicted position, per pixel of box side.
const STD_POSITION: f64 = 1.0 / 20.0;
/// Standard deviation of a velocity, per pixel of box side.
const STD_VELOCITY: f64 = 1.0 / 160.0;
/// Smallest box side used in the noise terms: a zero-size box would make them singular.
const MIN_SIDE: f64 = 1.0;

/// The filter's belief about one object: the mean state and its covariance.
#[derive(Debug, Clone)]
pub(super) struct Kalman {
    mean: Vector,
    covariance: Matrix,
}

impl Kalman {
    /// A filter started at `bbox`, its velocity unknown (zero, with a large variance).
    pub(super) fn new(bbox: &BBox) -> Self {
        let z = measurement(bbox);
        let mut mean = [0.0; DIM];
        mean[..MEASURED].copy_from_slice(&z);
        let (w, h) = (side(z[2]), side(z[3]));
        let std = [
            2.0 * STD_POSITION * w,
            2.0 * STD_POSITION * h,
            2.0 * STD_POSITION * w,
            2.0 * STD_POSITION * h,
            10.0 * STD_VELOCITY * w,
            10.0 * STD_VELOCITY * h,
            10.0 * STD_VELOCITY * w,
            10.0 * STD_VELOCITY * h,
        ];
        Self {
            mean,
            covariance: diagonal(&std),
        }
    }

    /// Moves the belief one frame ahead: position += velocity, uncertainty grows.
    pub(super) fn predict(&mut self) {
        let (w, h) = (side(self.mean[2]), side(self.mean[3]));
        let std = [
            STD_POSITION * w,
            STD_POSITION * h,
            STD_POSITION * w,
            STD_POSITION * h,
            STD_VELOCITY * w,
            STD_VELOCITY * h,
            STD_VELOCITY * w,
            STD_VELOCITY * h,
        ];
        for i in 0..MEASURED {
            self.mean[i] += self.mean[i + MEASURED];
        }
        // P' = F P F^T + Q with F = [[I, I], [0, I]]: add the velocity rows to the position
        // rows, then the velocity columns to the position columns.
        let p = &mut self.covariance;
        for i in 0..MEASURED {
            for j in 0..DIM {
                p[i][j] += p[i + MEASURED][j];
            }
        }
        for row in p.iter_mut() {
            for j in 0..MEASURED {
                row[j] += row[j + MEASURED];
            }
        }
        for (i, s) in std.iter().enumerate() {
            p[i][i] += s * s;
        }
    }

    /// Stops the box's size from changing in later predictions (its position still moves). For
    /// an object that was not seen: the growth or shrinking of its last few boxes (often an
    /// object going out of view behind something) is not worth extrapolating over many frames.
    pub(super) fn hold_size(&mut self) {
        self.mean[6] = 0.0;
        self.mean[7] = 0.0;
    }

    /// Corrects the belief with a measured box.
    pub(super) fn update(&mut self, bbox: &BBox) {
        let z = measurement(bbox);
        let (w, h) = (side(self.mean[2]), side(self.mean[3]));
        let r = [
            STD_POSITION * w,
            STD_POSITION * h,
            STD_POSITION * w,
            STD_POSITION * h,
        ];
        // S = H P H^T + R: the top-left block of P, plus the measurement noise.
        let mut s = [[0.0; MEASURED]; MEASURED];
        for i in 0..MEASURED {
            for j in 0..MEASURED {
                s[i][j] = self.covariance[i][j];
            }
            s[i][i] += r[i] * r[i];
        }
        let Some(s_inv) = invert(s) else {
            // Cannot happen (S is positive definite: R > 0); keep the prediction if it does.
            return;
        };
        // K = P H^T S^-1: P's first four columns times S^-1.
        let mut k = [[0.0; MEASURED]; DIM];
        for (i, row) in k.iter_mut().enumerate() {
            for (j, kij) in row.iter_mut().enumerate() {
                *kij = (0..MEASURED)
                    .map(|m| self.covariance[i][m] * s_inv[m][j])
                    .sum();
            }
        }
        let innovation: [f64; MEASURED] = std::array::from_fn(|i| z[i] - self.mean[i]);
        for (i, row) in k.iter().enumerate() {
            self.mean[i] += (0..MEASURED).map(|j| row[j] * innovation[j]).sum::<f64>();
        }
        // P' = P - K H P: K times P's first four rows.
        let old = self.covariance;
        for i in 0..DIM {
            for j in 0..DIM {
                self.covariance[i][j] -= (0..MEASURED).map(|m| k[i][m] * old[m][j]).sum::<f64>();
            }
        }
    }

    /// The box the filter believes in (sides never negative).
    pub(super) fn bbox(&self) -> BBox {
        let [cx, cy, w, h, ..] = self.mean;
        let (w, h) = (w.max(0.0), h.max(0.0));
        BBox {
            x: (cx - w / 2.0) as f32,
            y: (cy - h / 2.0) as f32,
            width: w as f32,
            height: h as f32,
        }
    }
}

fn measurement(b: &BBox) -> [f64; MEASURED] {
    let (w, h) = (f64::from(b.width), f64::from(b.height));
    [f64::from(b.x) + w / 2.0, f64::from(b.y) + h / 2.0, w, h]
}

fn side(v: f64) -> f64 {
    v.max(MIN_SIDE)
}

fn diagonal(std: &Vector) -> Matrix {
    let mut m = [[0.0; DIM]; DIM];
    for (i, s) in std.iter().enumerate() {
        m[i][i] = s * s;
    }
    m
}

/// The inverse of a 4x4 matrix by Gauss-Jordan elimination with partial pivoting; `None` when
/// it is singular.
fn invert(mut a: [[f64; MEASURED]; MEASURED]) -> Option<[[f64; MEASURED]; MEASURED]> {
    let mut inv = [[0.0; MEASURED]; MEASURED];
    for (i, row) in inv.iter_mut().enumerate() {
        row[i] = 1.0;
    }
    for col in 0..MEASURED {
        let pivot = (col..MEASURED).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[pivot][col].abs() < f64::EPSILON {
            return None;
        }
        a.swap(col, pivot);
        inv.swap(col, pivot);
        let p = a[col][col];
        for j in 0..MEASURED {
            a[col][j] /= p;
            inv[col][j] /= p;
        }
        for r in 0..MEASURED {
            if r != col {
                let f = a[r][col];
                for j in 0..MEASURED {
                    a[r][j] -= f * a[col][j];
                    inv[r][j] -= f * inv[col][j];
                }
            }
        }
    }
    Some(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bbox(x: f32, y: f32) -> BBox {
        BBox {
            x,
            y,
            width: 20.0,
            height: 40.0,
        }
    }

    #[test]
    fn learns_a_constant_velocity_and_predicts_along_it() {
        let mut k = Kalman::new(&bbox(0.0, 100.0));
        for f in 1..=20 {
            k.predict();
            k.update(&bbox(5.0 * f as f32, 100.0 - 2.0 * f as f32));
        }
        for _ in 0..10 {
            k.predict();
        }
        let b = k.bbox();
        // Truth after 30 frames: x = 150, y = 40.
        assert!((b.x - 150.0).abs() < 2.0, "{b:?}");
        assert!((b.y - 40.0).abs() < 2.0, "{b:?}");
        assert!(
            (b.width - 20.0).abs() < 1.0 && (b.height - 40.0).abs() < 1.0,
            "{b:?}"
        );
    }

    #[test]
    fn a_measurement_pulls_the_state_towards_it() {
        let mut k = Kalman::new(&bbox(0.0, 0.0));
        k.predict();
        k.update(&bbox(10.0, 0.0));
        let x = k.bbox().x;
        assert!(x > 0.0 && x <= 10.0, "{x}");
    }

    #[test]
    fn a_held_size_stays_while_the_box_moves_on() {
        let mut k = Kalman::new(&bbox(0.0, 0.0));
        for f in 1..=10 {
            k.predict();
            // Moving right 4 px a frame and shrinking 1 px a frame.
            let mut b = bbox(4.0 * f as f32, 0.0);
            b.width -= f as f32;
            k.update(&b);
        }
        k.hold_size();
        let width = k.bbox().width;
        let x = k.bbox().x;
        for _ in 0..10 {
            k.predict();
        }
        assert!((k.bbox().width - width).abs() < 1e-3, "{:?}", k.bbox());
        assert!(k.bbox().x > x + 30.0, "{:?}", k.bbox());
    }

    #[test]
    fn inverts_a_matrix() {
        let a = [
            [4.0, 1.0, 0.0, 0.0],
            [1.0, 3.0, 0.5, 0.0],
            [0.0, 0.5, 2.0, 0.1],
            [0.0, 0.0, 0.1, 1.0],
        ];
        let inv = invert(a).unwrap();
        for i in 0..4 {
            for j in 0..4 {
                let v: f64 = (0..4).map(|m| a[i][m] * inv[m][j]).sum();
                assert!((v - if i == j { 1.0 } else { 0.0 }).abs() < 1e-9);
            }
        }
        assert!(invert([[0.0; 4]; 4]).is_none());
    }
}
