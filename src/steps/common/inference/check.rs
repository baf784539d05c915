//! What `auto` judges engines on: a model's check image (one picture with objects; a synthetic
//! one where there is none) and its check clip (consecutive frames of a video, stacked top to
//! bottom in one PNG), and the tracks an engine's detections give on that clip.

use std::path::Path;

use opencv::core::{Mat, MatTraitConst, MatTraitManual, Rect};

use super::{Check, Engine, agree};
use crate::steps::tracker::follow_clip;
use crate::value::Track;

/// The picture `auto` judges engines on: the model's check image (`real`), else a synthetic
/// one (a gradient with a few shapes: enough to compare f32 outputs, not to judge boxes).
pub(in crate::steps) fn check_image(path: Option<&Path>) -> (Mat, bool) {
    if let Some(path) = path {
        match opencv::imgcodecs::imread(path, opencv::imgcodecs::IMREAD_COLOR) {
            Ok(image) if !image.empty() => return (image, true),
            Ok(_) | Err(_) => {
                tracing::warn!(path = %path.display(), "check image unreadable; judging engines on a synthetic picture");
            }
        }
    }
    (synthetic_image(), false)
}

/// The frames of a model's check clip (`frames` of them stacked top to bottom in the picture at
/// `path`), each a picture of its own; none (and a warning) when the file cannot be read or is
/// not `frames` pictures of one height.
pub(super) fn check_clip(clip: Option<(&Path, u32)>) -> Vec<Mat> {
    let Some((path, frames)) = clip else {
        return Vec::new();
    };
    match read_clip(path, frames) {
        Ok(frames) => frames,
        Err(why) => {
            tracing::warn!(path = %path.display(), "check clip {why}; auto takes no reduced precision for this model");
            Vec::new()
        }
    }
}

fn read_clip(path: &Path, frames: u32) -> Result<Vec<Mat>, String> {
    let strip = opencv::imgcodecs::imread(path, opencv::imgcodecs::IMREAD_COLOR)
        .map_err(|e| format!("unreadable: {e}"))?;
    let n = i32::try_from(frames).unwrap_or(0);
    if strip.empty() || n == 0 || strip.rows() % n != 0 {
        return Err(format!(
            "is not {frames} frames stacked ({}x{} pixels)",
            strip.cols(),
            strip.rows()
        ));
    }
    let height = strip.rows() / n;
    (0..n)
        .map(|i| {
            Mat::roi(&strip, Rect::new(0, i * height, strip.cols(), height))
                .and_then(|view| view.try_clone())
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// The tracks the tracker (its default settings) makes of `engine`'s detections on `clip`,
/// frame by frame.
pub(super) fn clip_tracks(
    engine: &dyn Engine,
    check: &Check<'_>,
    clip: &[Mat],
) -> Result<Vec<Vec<Track>>, String> {
    if clip.is_empty() {
        return Err("the check clip is unreadable".to_owned());
    }
    let mut detections = Vec::with_capacity(clip.len());
    for frame in clip {
        let input = (check.input)(frame).map_err(|e| e.to_string())?;
        let outputs = engine.forward(&input).map_err(|e| e.to_string())?;
        agree::finite(&outputs)?;
        detections.push((check.detections)(frame, &outputs).map_err(|e| e.to_string())?);
    }
    let (width, height) = clip
        .first()
        .map_or((0, 0), |f| (f.cols().max(0) as u32, f.rows().max(0) as u32));
    Ok(follow_clip(width, height, &detections))
}

fn synthetic_image() -> Mat {
    use opencv::core::{CV_8UC3, Point, Scalar};
    let (w, h) = (640, 480);
    let mut image =
        Mat::new_rows_cols_with_default(h, w, CV_8UC3, Scalar::all(0.0)).unwrap_or_default();
    if let Ok(data) = image.data_bytes_mut() {
        for (i, px) in data.chunks_exact_mut(3).enumerate() {
            let (x, y) = ((i % w as usize) as u32, (i / w as usize) as u32);
            px.copy_from_slice(&[
                (x * 255 / 640) as u8,
                (y * 255 / 480) as u8,
                ((x + y) % 256) as u8,
            ]);
        }
    }
    for (i, colour) in [[255.0, 255.0, 255.0], [0.0, 0.0, 0.0], [40.0, 90.0, 200.0]]
        .into_iter()
        .enumerate()
    {
        let i = i as i32;
        let _ = opencv::imgproc::rectangle(
            &mut image,
            Rect::new(80 + 180 * i, 120 + 40 * i, 90, 200),
            Scalar::new(colour[0], colour[1], colour[2], 0.0),
            -1,
            opencv::imgproc::LINE_8,
            0,
        );
        let _ = opencv::imgproc::circle(
            &mut image,
            Point::new(125 + 180 * i, 90 + 40 * i),
            30,
            Scalar::new(colour[2], colour[1], colour[0], 0.0),
            -1,
            opencv::imgproc::LINE_8,
            0,
        );
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clip_is_its_frames_in_order_and_a_wrong_count_is_no_clip() {
        use opencv::core::{CV_8UC3, MatTrait, Scalar};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clip.png");
        // Three 4x2 frames of grey 10, 20, 30.
        let mut strip = Mat::new_rows_cols_with_default(6, 4, CV_8UC3, Scalar::all(0.0)).unwrap();
        for i in 0..3 {
            let mut view = Mat::roi_mut(&mut strip, Rect::new(0, i * 2, 4, 2)).unwrap();
            view.set_to_def(&Scalar::all(f64::from(10 * (i + 1))))
                .unwrap();
        }
        opencv::imgcodecs::imwrite_def(path.to_str().unwrap(), &strip).unwrap();
        let frames = check_clip(Some((&path, 3)));
        assert_eq!(frames.len(), 3);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!((f.cols(), f.rows()), (4, 2));
            assert_eq!(
                *f.at_2d::<opencv::core::Vec3b>(1, 3).unwrap(),
                [10 * (i as u8 + 1); 3].into()
            );
        }
        assert!(check_clip(Some((&path, 4))).is_empty());
        assert!(check_clip(Some((&dir.path().join("none.png"), 3))).is_empty());
        assert!(check_clip(None).is_empty());
    }
}
