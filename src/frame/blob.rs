//! A network's input made straight from a frame: planar (C, H, W) f32, scaled, in RGB or BGR
//! order, written where the engine reads it.
//!
//! A decoded frame (I420 or NV12) never becomes a full-size BGR image for this: its luma and
//! chroma planes are each scaled to the network's size by OpenCV (bilinear, as
//! `blobFromImage` scales), and one pass converts the three small planes (BT.601, limited
//! range, OpenCV's coefficients) into the three output planes. A frame of 768x576 for a 320
//! input converts 102,400 pixels instead of 442,368, and writes no BGR image, no resized copy
//! and no blob of its own. The frame's planes are used even when some step has made its BGR
//! image already, so a detector's input (and its boxes) never depends on which step ran first.
//! An image that is BGR already (a step's output, a still picture) is scaled as it is and
//! spread into the planes, exactly as `dnn::blobFromImage` does.

use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, Size};
use opencv::imgproc;

use super::{Frame, FrameError, Pixels, Planes, convert};

/// How a network wants its input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlobSpec {
    pub width: i32,
    pub height: i32,
    /// Multiplies each 0..255 value: 1/255 for inputs in 0..1.
    pub scale: f32,
    /// Plane order R, G, B; else B, G, R.
    pub rgb: bool,
}

impl BlobSpec {
    /// Values the input holds: 3 planes of `width` x `height`.
    pub fn values(&self) -> usize {
        3 * self.pixels()
    }

    fn pixels(&self) -> usize {
        usize::try_from(self.width).unwrap_or(0) * usize::try_from(self.height).unwrap_or(0)
    }

    fn size(&self) -> Size {
        Size::new(self.width, self.height)
    }

    /// The output planes in R, G, B order.
    fn planes<'a>(&self, out: &'a mut [f32]) -> [&'a mut [f32]; 3] {
        let n = self.pixels();
        let (first, rest) = out.split_at_mut(n);
        let (second, third) = rest.split_at_mut(n);
        if self.rgb {
            [first, second, third]
        } else {
            [third, second, first]
        }
    }

    fn check(&self, out: &[f32]) -> Result<(), FrameError> {
        if self.width < 1 || self.height < 1 || out.len() != self.values() {
            return Err(FrameError::Map(format!(
                "an input of {} values for {}x{}x3",
                out.len(),
                self.width,
                self.height
            )));
        }
        Ok(())
    }
}

/// BT.601 limited range, as OpenCV's `COLOR_YUV2BGR_*` (its fixed-point coefficients / 2^20).
const CY: f32 = 1_220_542.0 / 1_048_576.0;
const CVR: f32 = 1_673_527.0 / 1_048_576.0;
const CVG: f32 = -852_492.0 / 1_048_576.0;
const CUG: f32 = -409_993.0 / 1_048_576.0;
const CUB: f32 = 2_116_026.0 / 1_048_576.0;

impl Frame {
    /// Writes the frame, scaled to the spec's size, into `out` (see the module).
    pub fn write_blob(&self, spec: BlobSpec, out: &mut [f32]) -> Result<(), FrameError> {
        spec.check(out)?;
        let planes = match &self.pixels {
            Pixels::Mapped { planes, .. } => planes,
            Pixels::Owned(mat) => return bgr_blob(mat.as_ref().map_err(Clone::clone)?, spec, out),
        };
        let size = spec.size();
        let linear = imgproc::INTER_LINEAR;
        match planes {
            Planes::I420 { y, u, v, .. } => {
                let (y, u, v) = (
                    convert::scaled(y, size, linear)?,
                    convert::scaled(u, size, linear)?,
                    convert::scaled(v, size, linear)?,
                );
                let [r, g, b] = spec.planes(out);
                yuv_planar(
                    [y.data_bytes()?, u.data_bytes()?, v.data_bytes()?],
                    spec.scale,
                    [r, g, b],
                );
            }
            Planes::Nv12 { y, uv } => {
                let (y, uv) = (
                    convert::scaled(y, size, linear)?,
                    convert::scaled(uv, size, linear)?,
                );
                let [r, g, b] = spec.planes(out);
                nv12_planar([y.data_bytes()?, uv.data_bytes()?], spec.scale, [r, g, b]);
            }
            Planes::Bgr => bgr_blob(self.bgr()?, spec, out)?,
        }
        Ok(())
    }
}

/// Full-size Y, U and V planes -> R, G and B planes, times `scale`.
fn yuv_planar([y, u, v]: [&[u8]; 3], scale: f32, [r, g, b]: [&mut [f32]; 3]) {
    let top = 255.0 * scale;
    let it = y
        .iter()
        .zip(u)
        .zip(v)
        .zip(r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()));
    for (((y, u), v), ((r, g), b)) in it {
        let (y, u, v) = (
            (f32::from(*y) - 16.0) * CY,
            f32::from(*u) - 128.0,
            f32::from(*v) - 128.0,
        );
        *r = ((y + CVR * v) * scale).max(0.0).min(top);
        *g = ((y + CVG * v + CUG * u) * scale).max(0.0).min(top);
        *b = ((y + CUB * u) * scale).max(0.0).min(top);
    }
}

/// A full-size Y plane and interleaved U, V plane -> R, G and B planes, times `scale`.
fn nv12_planar([y, uv]: [&[u8]; 2], scale: f32, [r, g, b]: [&mut [f32]; 3]) {
    let top = 255.0 * scale;
    let it = y
        .iter()
        .zip(uv.chunks_exact(2))
        .zip(r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()));
    for ((y, uv), ((r, g), b)) in it {
        let (y, u, v) = (
            (f32::from(*y) - 16.0) * CY,
            f32::from(uv[0]) - 128.0,
            f32::from(uv[1]) - 128.0,
        );
        *r = ((y + CVR * v) * scale).max(0.0).min(top);
        *g = ((y + CVG * v + CUG * u) * scale).max(0.0).min(top);
        *b = ((y + CUB * u) * scale).max(0.0).min(top);
    }
}

/// A BGR (or grey) image, scaled to the spec's size (bilinear, unless it has that size), into
/// the planes: the values `dnn::blobFromImage` gives.
pub fn bgr_blob(image: &Mat, spec: BlobSpec, out: &mut [f32]) -> Result<(), FrameError> {
    spec.check(out)?;
    let channels = image.channels();
    if channels != 3 && channels != 1 {
        return Err(FrameError::Map(format!(
            "an image of {channels} channels for a network input of 3"
        )));
    }
    let scaled = if image.size()? == spec.size() && image.is_continuous() {
        None
    } else {
        Some(convert::scaled(image, spec.size(), imgproc::INTER_LINEAR)?)
    };
    let pixels = scaled.as_ref().unwrap_or(image).data_bytes()?;
    let scale = spec.scale;
    let [r, g, b] = spec.planes(out);
    if channels == 1 {
        for (((p, r), g), b) in pixels.iter().zip(r).zip(g).zip(b) {
            let value = f32::from(*p) * scale;
            (*r, *g, *b) = (value, value, value);
        }
        return Ok(());
    }
    for (((p, r), g), b) in pixels.chunks_exact(3).zip(r).zip(g).zip(b) {
        *b = f32::from(p[0]) * scale;
        *g = f32::from(p[1]) * scale;
        *r = f32::from(p[2]) * scale;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Against OpenCV on real decoded video (`assets/Megamind.avi`, saturated colours): the BGR
    //! path gives `blobFromImage`'s values, the planes path what converting the whole frame and
    //! then scaling gives, within what scaling chroma on its own plane moves.

    use opencv::core::{self, Mat, MatTraitConstManual, Scalar, Size};
    use opencv::dnn;

    use super::{BlobSpec, bgr_blob};
    use crate::frame::Frame;
    use crate::frame::test_video::decoded;

    fn reference(bgr: &Mat, spec: BlobSpec) -> Vec<f32> {
        let blob = dnn::blob_from_image(
            bgr,
            f64::from(spec.scale),
            Size::new(spec.width, spec.height),
            Scalar::default(),
            spec.rgb,
            false,
            core::CV_32F,
        )
        .unwrap();
        blob.data_typed::<f32>().unwrap().to_vec()
    }

    const SPECS: [BlobSpec; 3] = [
        BlobSpec {
            width: 320,
            height: 320,
            scale: 1.0 / 255.0,
            rgb: true,
        },
        BlobSpec {
            width: 96,
            height: 64,
            scale: 1.0,
            rgb: false,
        },
        // Larger than the frame in both sides.
        BlobSpec {
            width: 800,
            height: 608,
            scale: 1.0 / 255.0,
            rgb: true,
        },
    ];

    #[test]
    fn a_bgr_image_gives_blob_from_image_values() {
        let d = decoded("video/x-raw,format=I420,width=720,height=528");
        let frame = Frame::from_buffer("cam".into(), 0, d.0, &d.1).unwrap();
        let bgr = frame.bgr().unwrap();
        for spec in SPECS {
            let mut out = vec![f32::NAN; spec.values()];
            bgr_blob(bgr, spec, &mut out).unwrap();
            let want = reference(bgr, spec);
            let worst = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0_f32, f32::max);
            assert!(worst <= 1e-6 * spec.scale.max(1.0), "{spec:?}: {worst}");
        }
    }

    #[test]
    fn frame_planes_give_the_converted_frame_scaled() {
        for format in ["I420", "NV12"] {
            for (w, h) in [(720, 528), (361, 263)] {
                let d = decoded(&format!("video/x-raw,format={format},width={w},height={h}"));
                let frame = Frame::from_buffer("cam".into(), 0, d.0.clone(), &d.1).unwrap();
                let whole = Frame::from_buffer("cam".into(), 0, d.0.clone(), &d.1).unwrap();
                for spec in SPECS {
                    let mut out = vec![f32::NAN; spec.values()];
                    frame.write_blob(spec, &mut out).unwrap();
                    assert!(!frame.has_bgr(), "{format} {w}x{h}: BGR made");
                    let want = reference(whole.bgr().unwrap(), spec);
                    // In 0..255 levels: chroma scaled on its own plane moves saturated edges by
                    // up to a pixel (see `convert`'s tests): a small mean, few large values.
                    let levels: Vec<f32> = out
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs() / spec.scale)
                        .collect();
                    let mean = levels.iter().sum::<f32>() / levels.len() as f32;
                    let large =
                        levels.iter().filter(|d| **d > 24.0).count() as f32 / levels.len() as f32;
                    assert!(
                        mean < 2.5 && large < 0.01,
                        "{format} {w}x{h} {spec:?}: mean {mean}, over 24: {large}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_wrong_output_length_is_an_error_not_a_panic() {
        let d = decoded("video/x-raw,format=I420,width=64,height=48");
        let frame = Frame::from_buffer("cam".into(), 0, d.0, &d.1).unwrap();
        let spec = SPECS[1];
        assert!(
            frame
                .write_blob(spec, &mut vec![0.0; spec.values() - 1])
                .is_err()
        );
        let bgr = Mat::new_rows_cols_with_default(4, 4, core::CV_8UC4, Scalar::all(0.0)).unwrap();
        assert!(bgr_blob(&bgr, spec, &mut vec![0.0; spec.values()]).is_err());
    }
}
