//! YUV 4:2:0 planes -> BGR with OpenCV, for the whole frame or only the part a step asks for.
//!
//! Chroma is shared by 2x2 pixels, so a region is first rounded out to even edges, its luma and
//! chroma cut from the planes (views, no copy), converted, and the exact rectangle taken from
//! the small result. A scaled image is made by scaling the luma plane to the asked size and the
//! chroma planes to half of it, then converting only the scaled planes. OpenCV's 4:2:0
//! conversions need an even size: an odd luma size is padded by repeating its last column and
//! row (the chroma planes already cover it), and the padding is cut off after conversion.

use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, Rect, Size, ToInputArray, Vec2b};
use opencv::imgproc;

use super::FrameError;

/// Rounds up to an even number.
fn even(n: i32) -> i32 {
    n + (n & 1)
}

/// The rectangle `rect` rounded out to even edges, clamped to a `width` x `height` luma plane
/// (only an odd frame size can make the rounded edge pass the plane's last column or row).
/// Returns the luma rectangle and the matching chroma rectangle.
pub(super) fn aligned(rect: Rect, width: i32, height: i32) -> (Rect, Rect) {
    let (x0, y0) = (rect.x & !1, rect.y & !1);
    let (x1, y1) = (even(rect.x + rect.width), even(rect.y + rect.height));
    let luma = Rect::new(x0, y0, x1.min(width) - x0, y1.min(height) - y0);
    let chroma = Rect::new(x0 / 2, y0 / 2, (x1 - x0) / 2, (y1 - y0) / 2);
    (luma, chroma)
}

/// Copies the rows of a one-channel plane into `out`, `to_cols` bytes a row, `to_rows` rows,
/// repeating the last column and row when the plane is smaller.
fn pack_plane(
    plane: &impl MatTraitConst,
    to_cols: i32,
    to_rows: i32,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let (cols, rows) = (plane.cols(), plane.rows());
    if cols < 1 || rows < 1 || cols > to_cols || rows > to_rows {
        return Err(FrameError::Map(format!(
            "plane of {cols}x{rows} does not fit {to_cols}x{to_rows}"
        )));
    }
    for r in 0..to_rows {
        let row = plane.at_row::<u8>(r.min(rows - 1))?;
        out.extend_from_slice(row);
        let last = row[row.len() - 1];
        out.extend(std::iter::repeat_n(last, (to_cols - cols) as usize));
    }
    Ok(())
}

/// `image` cut to `width` x `height` from its top-left corner (a no-op when it is that size).
fn cut(image: Mat, width: i32, height: i32) -> Result<Mat, FrameError> {
    if image.cols() == width && image.rows() == height {
        return Ok(image);
    }
    Ok(Mat::roi(&image, Rect::new(0, 0, width, height))?.try_clone()?)
}

/// BGR from I420 planes of any stride: luma `y` (w x h), chroma `u` and `v` (each
/// ceil(w/2) x ceil(h/2)). The planes are packed into OpenCV's layout, then converted.
pub(super) fn i420_to_bgr(
    y: &impl MatTraitConst,
    u: &impl MatTraitConst,
    v: &impl MatTraitConst,
) -> Result<Mat, FrameError> {
    let (w, h) = (y.cols(), y.rows());
    let (w2, h2) = (even(w), even(h));
    for c in [u.size()?, v.size()?] {
        if c != Size::new(w2 / 2, h2 / 2) {
            return Err(FrameError::Map(format!(
                "chroma plane of {}x{} does not match luma of {w}x{h}",
                c.width, c.height
            )));
        }
    }
    let mut bytes = Vec::with_capacity((w2 * h2 * 3 / 2) as usize);
    pack_plane(y, w2, h2, &mut bytes)?;
    pack_plane(u, w2 / 2, h2 / 2, &mut bytes)?;
    pack_plane(v, w2 / 2, h2 / 2, &mut bytes)?;
    let packed = Mat::from_slice(&bytes)?;
    let packed = packed.reshape(1, h2 * 3 / 2)?;
    let mut out = Mat::default();
    imgproc::cvt_color_def(&packed, &mut out, imgproc::COLOR_YUV2BGR_I420)?;
    cut(out, w, h)
}

/// BGR from NV12 planes of any stride: luma `y` (w x h) and interleaved chroma `uv`
/// (ceil(w/2) x ceil(h/2), two channels).
pub(super) fn nv12_to_bgr(
    y: &(impl MatTraitConst + ToInputArray),
    uv: &(impl MatTraitConst + ToInputArray),
) -> Result<Mat, FrameError> {
    let (w, h) = (y.cols(), y.rows());
    let (w2, h2) = (even(w), even(h));
    let c = uv.size()?;
    if c != Size::new(w2 / 2, h2 / 2)
        || uv.typ() != <Vec2b as opencv::core::DataType>::opencv_type()
    {
        return Err(FrameError::Map(format!(
            "chroma plane of {}x{} does not match luma of {w}x{h}",
            c.width, c.height
        )));
    }
    let mut out = Mat::default();
    if (w2, h2) == (w, h) {
        imgproc::cvt_color_two_plane(y, uv, &mut out, imgproc::COLOR_YUV2BGR_NV12)?;
        return Ok(out);
    }
    let mut bytes = Vec::with_capacity((w2 * h2) as usize);
    pack_plane(y, w2, h2, &mut bytes)?;
    let luma = Mat::from_slice(&bytes)?;
    let luma = luma.reshape(1, h2)?;
    imgproc::cvt_color_two_plane(&luma, uv, &mut out, imgproc::COLOR_YUV2BGR_NV12)?;
    cut(out, w, h)
}

/// `plane` scaled to `size` with `interpolation`.
pub(super) fn scaled(
    plane: &impl ToInputArray,
    size: Size,
    interpolation: i32,
) -> Result<Mat, FrameError> {
    let mut out = Mat::default();
    imgproc::resize(plane, &mut out, size, 0.0, 0.0, interpolation)?;
    Ok(out)
}

/// The chroma size of a `size` luma plane.
pub(super) fn chroma_size(size: Size) -> Size {
    Size::new(even(size.width) / 2, even(size.height) / 2)
}

#[cfg(test)]
mod tests {
    //! The cheap paths against the plain full conversion, on real decoded video: the animated
    //! `assets/Megamind.avi` (saturated colours, sharp edges: the hard case for chroma), decoded
    //! by GStreamer and, where a test needs it, scaled to an odd size or repacked as NV12.

    use gstreamer as gst;
    use gstreamer_video as gst_video;
    use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, Rect, Size};
    use opencv::imgproc;

    use crate::frame::test_video::decoded;
    use crate::frame::{Frame, FrameError};

    fn frame(decoded: &(gst::Buffer, gst_video::VideoInfo)) -> Frame {
        Frame::from_buffer("cam".into(), 0, decoded.0.clone(), &decoded.1).unwrap()
    }

    /// Mean and largest absolute difference of two BGR images of one size, and the share of
    /// channel values that differ by more than 24.
    fn difference(a: &Mat, b: &Mat) -> (f64, u8, f64) {
        assert_eq!((a.size().unwrap(), a.typ()), (b.size().unwrap(), b.typ()));
        let (a, b) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        let (a, b) = (a.data_bytes().unwrap(), b.data_bytes().unwrap());
        let diffs: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
        let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
        let large = diffs.iter().filter(|&&d| d > 24).count() as f64 / diffs.len() as f64;
        (mean, diffs.iter().copied().max().unwrap(), large)
    }

    /// The plain path: the whole frame converted, then the rectangle taken.
    fn full_region(d: &(gst::Buffer, gst_video::VideoInfo), rect: Rect) -> Mat {
        Mat::roi(frame(d).bgr().unwrap(), rect)
            .unwrap()
            .try_clone()
            .unwrap()
    }

    const FORMATS: [&str; 2] = ["I420", "NV12"];

    /// Rectangles at odd and even offsets, of odd and even sizes, touching every edge.
    fn rects(w: i32, h: i32) -> Vec<Rect> {
        vec![
            Rect::new(0, 0, 1, 1),
            Rect::new(1, 1, 1, 1),
            Rect::new(1, 3, 3, 5),
            Rect::new(101, 37, 77, 53),
            Rect::new(100, 36, 78, 54),
            Rect::new(w - 3, h - 5, 3, 5),
            Rect::new(w - 1, 0, 1, h),
            Rect::new(1, 1, w - 1, h - 1),
            Rect::new(0, 0, w, h),
        ]
    }

    #[test]
    fn a_region_converts_to_the_same_pixels_as_the_full_frame() {
        for format in FORMATS {
            // 720x528 as decoded, and an odd size (the last chroma column and row then cover
            // one luma column and row only).
            for (w, h) in [(720, 528), (361, 263)] {
                let d = decoded(&format!("video/x-raw,format={format},width={w},height={h}"));
                for rect in rects(w, h) {
                    let f = frame(&d);
                    let part = f.bgr_region(rect).unwrap();
                    assert!(
                        !f.has_bgr() || rect.width == w,
                        "{format} {w}x{h} {rect:?}: whole frame converted"
                    );
                    let (mean, max, _) = difference(&part, &full_region(&d, rect));
                    assert!(
                        max <= 1,
                        "{format} {w}x{h} {rect:?}: mean {mean}, max {max}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_region_outside_the_frame_is_an_error() {
        let d = decoded("video/x-raw,format=I420,width=64,height=48");
        for rect in [
            Rect::new(60, 0, 5, 1),
            Rect::new(0, 47, 1, 2),
            Rect::new(-1, 0, 2, 2),
            Rect::new(0, 0, 0, 4),
        ] {
            let err = frame(&d).bgr_region(rect).unwrap_err();
            assert!(matches!(err, FrameError::Region(_)), "{rect:?}: {err}");
        }
    }

    #[test]
    fn scaled_planes_convert_close_to_scaling_the_full_frame() {
        for format in FORMATS {
            for (w, h) in [(720, 528), (361, 263)] {
                let d = decoded(&format!("video/x-raw,format={format},width={w},height={h}"));
                for size in [
                    Size::new(w / 2, h / 2),
                    Size::new(320, 180),
                    Size::new(101, 77),
                    Size::new(w - 1, h),
                    Size::new(1, 1),
                ] {
                    let f = frame(&d);
                    let small = f.bgr_resized(size, imgproc::INTER_LINEAR).unwrap();
                    assert!(
                        !f.has_bgr(),
                        "{format} {w}x{h} to {size:?}: whole frame converted"
                    );
                    let mut plain = Mat::default();
                    imgproc::resize(
                        frame(&d).bgr().unwrap(),
                        &mut plain,
                        size,
                        0.0,
                        0.0,
                        imgproc::INTER_LINEAR,
                    )
                    .unwrap();
                    let (mean, max, large) = difference(&small, &plain);
                    // Chroma is interpolated from its own plane instead of from its 2x2
                    // copies: edges between saturated colours move by up to one pixel. Measured
                    // on this clip: mean 0.2 to 1.7, at most 0.5% of values off by more than 24.
                    assert!(
                        mean < 2.5 && large < 0.01,
                        "{format} {w}x{h} to {size:?}: mean {mean:.2}, max {max}, over 24: {:.3}%",
                        large * 100.0
                    );
                }
            }
        }
    }

    #[test]
    fn scaling_up_or_after_conversion_scales_the_bgr_image_itself() {
        let d = decoded("video/x-raw,format=I420,width=90,height=66");
        let mut plain = Mat::default();
        let bigger = Size::new(181, 133);
        imgproc::resize(
            frame(&d).bgr().unwrap(),
            &mut plain,
            bigger,
            0.0,
            0.0,
            imgproc::INTER_LINEAR,
        )
        .unwrap();
        let f = frame(&d);
        let up = f.bgr_resized(bigger, imgproc::INTER_LINEAR).unwrap();
        assert!(f.has_bgr());
        assert_eq!(difference(&up, &plain).1, 0);
        // Once the BGR image is there, a smaller size is scaled from it, not from the planes.
        let smaller = Size::new(45, 33);
        let mut plain = Mat::default();
        imgproc::resize(
            f.bgr().unwrap(),
            &mut plain,
            smaller,
            0.0,
            0.0,
            imgproc::INTER_AREA,
        )
        .unwrap();
        assert_eq!(
            difference(
                &f.bgr_resized(smaller, imgproc::INTER_AREA).unwrap(),
                &plain
            )
            .1,
            0
        );
    }
}
