//! `backend = "auto"`: every installed engine timed on the model's check image, checked
//! against full precision, and the most precise of the nearly fastest taken; the decision kept
//! for the process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::Instant;

use opencv::core::{Mat, MatTraitConst, MatTraitManual};

use super::{
    Backend, Check, Engine, Files, Network, Precision, Request, Tensor, availability, load_engine,
};
use crate::spec::Diagnostic;
use crate::value::BBox;

/// The picture `auto` judges engines on: the model's check image (`real`), else a synthetic
/// one (a gradient with a few shapes: enough to compare f32 outputs, not to judge boxes).
pub(in crate::steps) fn check_image(path: Option<&std::path::Path>) -> (Mat, bool) {
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

fn synthetic_image() -> Mat {
    use opencv::core::{CV_8UC3, Point, Rect, Scalar};
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

/// Largest difference allowed between two f32 engines' outputs, relative to 1 + |value|.
pub(super) const F32_TOLERANCE: f32 = 1e-3;
/// Share of the full-precision boxes a reduced precision must find (and of its boxes that must
/// be full precision's), at IoU 0.5.
pub(super) const MIN_AGREEMENT: f64 = 0.95;
/// Timed forward passes per candidate (after one warm-up), the fastest taken: the least
/// disturbed by other work on a shared machine.
const TIMED_RUNS: usize = 5;
/// Candidates within this share of the fastest count as equally fast, and the most precise of
/// them is taken: a reduced precision must be clearly faster to be chosen, so that the choice
/// does not flip between close candidates from one start to the next.
const CLOSE: f64 = 0.15;

/// A candidate's result on the check input.
struct Trial {
    backend: Backend,
    precision: Precision,
    engine: Box<dyn Engine>,
    ms: f64,
    outputs: Vec<Tensor>,
}

/// Runs a candidate on the check input: one warm-up, then the fastest of [`TIMED_RUNS`].
fn trial(
    backend: Backend,
    precision: Precision,
    files: Files<'_>,
    request: Request,
    check: &Check<'_>,
) -> Result<Trial, String> {
    availability(backend)?;
    let engine = load_engine(backend, precision, files, request.threads)?;
    let mut outputs = engine.forward(&check.input).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(TIMED_RUNS);
    for _ in 0..TIMED_RUNS {
        let start = Instant::now();
        outputs = engine.forward(&check.input).map_err(|e| e.to_string())?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(Trial {
        backend,
        precision,
        engine,
        ms: times[0],
        outputs,
    })
}

/// The decision `auto` made for one model and request, kept for the process so that `validate`
/// then `run`, or a reload, do not measure again.
type Decisions =
    HashMap<(String, Option<PathBuf>, Request, Vec<i32>, String), (Backend, Precision)>;

fn decisions() -> &'static Mutex<Decisions> {
    static DECISIONS: OnceLock<Mutex<Decisions>> = OnceLock::new();
    DECISIONS.get_or_init(Mutex::default)
}

/// `auto`: the fastest engine that loads and agrees with full precision on the check input.
pub(super) fn choose(
    files: Files<'_>,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    let label = &files.others.label;
    let key = (
        label.clone(),
        files.others.onnx.clone(),
        request,
        check.input.mat_size().iter().copied().collect(),
        check.settings.clone(),
    );
    let decided = decisions()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .copied();
    if let Some((backend, precision)) = decided {
        let engine = load_engine(backend, precision, files, request.threads)
            .map_err(|e| Diagnostic::new(format!("backend \"{}\": {e}", backend.name())))?;
        return Ok(Network {
            engine,
            backend,
            precision,
        });
    }
    let mut candidates = vec![
        (Backend::OpenCv, Precision::F32),
        (Backend::OnnxRuntime, Precision::F32),
        (Backend::OpenVino, Precision::F32),
        (Backend::OpenVino, Precision::Bf16),
        (Backend::OnnxRuntime, Precision::Int8),
        (Backend::OpenVino, Precision::Int8),
    ];
    if files.others.onnx_int8.is_none() {
        candidates.retain(|c| c.1 != Precision::Int8);
    }
    if let Some(p) = request.precision {
        candidates.retain(|c| c.1 == p);
    }
    let mut notes: Vec<String> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut reference: Option<Vec<Tensor>> = None;
    let mut reference_boxes: Option<Vec<BBox>> = None;
    let mut agreed: Vec<Trial> = Vec::new();
    for (backend, precision) in candidates {
        let candidate = format!("{} {}", backend.name(), precision.name());
        if let Err(why) = availability(backend) {
            if !missing.iter().any(|m| m.starts_with(backend.name())) {
                missing.push(format!("{}: {why}", backend.name()));
            }
            continue;
        }
        let t = match trial(backend, precision, files, request, check) {
            Ok(t) => t,
            Err(e) => {
                notes.push(format!("{candidate} failed: {e}"));
                continue;
            }
        };
        // Agreement with full precision.
        let verdict = match (precision, &reference) {
            (Precision::F32, None) => {
                reference = Some(t.outputs.clone());
                Ok(())
            }
            (Precision::F32, Some(r)) => outputs_agree(r, &t.outputs),
            (Precision::Bf16 | Precision::Int8, _) if !check.real => {
                Err("not judged: no check image with objects for this model".to_owned())
            }
            (Precision::Bf16 | Precision::Int8, None) => {
                Err("not judged: no f32 engine to compare with".to_owned())
            }
            (Precision::Bf16 | Precision::Int8, Some(r)) => {
                if reference_boxes.is_none() {
                    reference_boxes = Some((check.boxes)(r).map_err(|e| {
                        Diagnostic::new(format!("{label}: decoding the check image: {e}"))
                    })?);
                }
                let full = reference_boxes.as_deref().unwrap_or_default();
                let reduced = (check.boxes)(&t.outputs).map_err(|e| e.to_string());
                reduced.and_then(|reduced| boxes_agree(full, &reduced))
            }
        };
        match verdict {
            Err(why) => notes.push(format!("{candidate} {:.1} ms, disagreed: {why}", t.ms)),
            Ok(()) => {
                notes.push(format!("{candidate} {:.1} ms", t.ms));
                agreed.push(t);
            }
        }
    }
    if !missing.is_empty() {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "backend auto: {}; networks run on what is installed",
                missing.join("; ")
            );
        });
    }
    let times: Vec<(Precision, f64)> = agreed.iter().map(|t| (t.precision, t.ms)).collect();
    let Some(best) = pick(&times).map(|i| agreed.swap_remove(i)) else {
        return Err(Diagnostic::new(format!(
            "{label}: no engine could run it ({})",
            notes.join("; ")
        )));
    };
    tracing::info!(
        model = %label,
        backend = best.backend.name(),
        precision = best.precision.name(),
        threads = request.threads,
        ms = format!("{:.1}", best.ms),
        "network engine chosen by auto: the fastest that agrees with f32 on the check image, the most precise within 15% of it ({})",
        notes.join(", ")
    );
    decisions()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, (best.backend, best.precision));
    Ok(Network {
        engine: best.engine,
        backend: best.backend,
        precision: best.precision,
    })
}

/// Of candidates that agreed, `(precision, ms)`: the index of the most precise of those within
/// [`CLOSE`] of the fastest (the fastest among equals).
fn pick(times: &[(Precision, f64)]) -> Option<usize> {
    let fastest = times.iter().map(|t| t.1).min_by(f64::total_cmp)?;
    let rank = |p: Precision| match p {
        Precision::F32 => 0,
        Precision::Bf16 => 1,
        Precision::Int8 => 2,
    };
    times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.1 <= fastest * (1.0 + CLOSE))
        .min_by(|a, b| rank(a.1.0).cmp(&rank(b.1.0)).then(a.1.1.total_cmp(&b.1.1)))
        .map(|(i, _)| i)
}

/// Two f32 engines agree: the same outputs, each value within [`F32_TOLERANCE`].
pub(super) fn outputs_agree(reference: &[Tensor], other: &[Tensor]) -> Result<(), String> {
    if reference.len() != other.len() {
        return Err(format!(
            "{} outputs against {}",
            other.len(),
            reference.len()
        ));
    }
    let mut worst = 0.0_f32;
    for (r, o) in reference.iter().zip(other) {
        if r.data.len() != o.data.len() {
            return Err(format!(
                "an output of {} values against {}",
                o.data.len(),
                r.data.len()
            ));
        }
        for (a, b) in r.data.iter().zip(&o.data) {
            worst = worst.max((a - b).abs() / (1.0 + a.abs()));
        }
    }
    if worst <= F32_TOLERANCE {
        Ok(())
    } else {
        Err(format!("outputs differ by up to {worst:.2e}"))
    }
}

/// Share of `a`'s boxes that some box of `b` overlaps at IoU 0.5 or more.
pub(super) fn recall(a: &[BBox], b: &[BBox]) -> f64 {
    if a.is_empty() {
        return 1.0;
    }
    let found = a
        .iter()
        .filter(|x| b.iter().any(|y| x.iou(y) >= 0.5))
        .count();
    found as f64 / a.len() as f64
}

/// A reduced precision agrees: it finds [`MIN_AGREEMENT`] of full precision's boxes and adds
/// few of its own, on a check image where full precision finds some.
fn boxes_agree(full: &[BBox], reduced: &[BBox]) -> Result<(), String> {
    if full.is_empty() {
        return Err("not judged: f32 finds nothing on the check image".to_owned());
    }
    let (found, precise) = (recall(full, reduced), recall(reduced, full));
    if found >= MIN_AGREEMENT && precise >= MIN_AGREEMENT {
        Ok(())
    } else {
        Err(format!(
            "finds {:.0}% of f32's {} boxes, {:.0}% of its {} are f32's",
            found * 100.0,
            full.len(),
            precise * 100.0,
            reduced.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(data: &[f32]) -> Tensor {
        Tensor {
            shape: vec![data.len()],
            data: data.to_vec(),
        }
    }

    #[test]
    fn auto_takes_the_most_precise_of_the_nearly_fastest() {
        use Precision::*;
        assert_eq!(pick(&[]), None);
        // bf16 clearly faster than f32: bf16.
        assert_eq!(
            pick(&[(F32, 25.0), (F32, 26.0), (Bf16, 6.0), (Int8, 7.5)]),
            Some(2)
        );
        // int8 within 15% of bf16: bf16, the more precise.
        assert_eq!(pick(&[(Bf16, 6.0), (Int8, 5.5)]), Some(0));
        // int8 clearly faster: int8.
        assert_eq!(pick(&[(Bf16, 6.0), (Int8, 4.0)]), Some(1));
        // f32 engines within 15%: the faster of them.
        assert_eq!(pick(&[(F32, 27.0), (F32, 25.0), (Bf16, 26.0)]), Some(1));
    }

    #[test]
    fn f32_outputs_agree_within_the_tolerance_only() {
        let r = [tensor(&[0.5, 10.0])];
        assert!(outputs_agree(&r, &[tensor(&[0.5005, 10.005])]).is_ok());
        let e = outputs_agree(&r, &[tensor(&[0.51, 10.0])]).unwrap_err();
        assert!(e.contains("differ by up to"), "{e}");
        assert!(outputs_agree(&r, &[tensor(&[0.5])]).is_err());
        assert!(outputs_agree(&r, &[]).is_err());
    }

    fn bbox(x: f32) -> BBox {
        BBox {
            x,
            y: 0.0,
            width: 10.0,
            height: 10.0,
        }
    }

    #[test]
    fn a_reduced_precision_must_find_the_same_boxes_both_ways() {
        let full: Vec<BBox> = (0..20).map(|i| bbox(i as f32 * 20.0)).collect();
        let shifted: Vec<BBox> = full.iter().map(|b| bbox(b.x + 1.0)).collect();
        assert!(boxes_agree(&full, &shifted).is_ok());
        // One of 20 missed: 95%, still agrees; two: not.
        assert!(boxes_agree(&full, &shifted[1..]).is_ok());
        assert!(boxes_agree(&full, &shifted[2..]).is_err());
        // Two boxes of its own among 20: 90% precise.
        let mut extra = shifted.clone();
        extra.extend([bbox(1000.0), bbox(2000.0)]);
        assert!(boxes_agree(&full, &extra).is_err());
        assert!(boxes_agree(&[], &shifted).is_err());
    }
}
