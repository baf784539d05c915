//! `backend = "auto"`: every installed engine timed on the model's check image, checked
//! against full precision, and the most precise of the nearly fastest taken; the decision kept
//! for the process.
//!
//! What is counted must not depend on the machine, so a reduced precision (bf16, int8) is taken
//! only where it keeps full precision's tracks: it must find f32's boxes on the check image
//! ([`agree::boxes_agree`]) and, on the model's check clip, the tracker must follow the same
//! objects with the same IDs from its detections as from f32's ([`agree::tracks_agree`]). Every
//! reduced precision that agrees on the image, and is faster than every more precise engine
//! that agrees (else it is never taken), is run on the clip: the log names each engine and
//! precision `auto` could take on this machine, whichever is fastest at the moment.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::Instant;

use opencv::core::{Mat, MatTraitConst};

use super::check::{check_clip, clip_tracks};
use super::{
    Backend, Check, Engine, Files, Network, Precision, Precisions, Request, Tensor, agree,
    availability, load_engine,
};
use crate::spec::Diagnostic;
use crate::value::{BBox, Track};

/// Timed forward passes per candidate (after one warm-up), the fastest taken: the least
/// disturbed by other work on a shared machine.
const TIMED_RUNS: usize = 5;
/// Candidates within this share of the fastest count as equally fast, and the most precise of
/// them is taken: a reduced precision must be clearly faster to be chosen, so that the choice
/// does not flip between close candidates from one start to the next.
const CLOSE: f64 = 0.15;

/// A candidate's result on the check input.
pub(super) struct Trial {
    pub(super) backend: Backend,
    pub(super) precision: Precision,
    pub(super) engine: Box<dyn Engine>,
    pub(super) ms: f64,
    pub(super) outputs: Vec<Tensor>,
}

impl Trial {
    fn name(&self) -> String {
        format!("{} {}", self.backend.name(), self.precision.name())
    }
}

/// Runs a loaded engine on the check input: one warm-up, then the fastest of [`TIMED_RUNS`].
/// Outputs that are not numbers fail it.
pub(super) fn measure(
    backend: Backend,
    precision: Precision,
    engine: Box<dyn Engine>,
    input: &Mat,
) -> Result<Trial, String> {
    let mut outputs = engine.forward(input).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(TIMED_RUNS);
    for _ in 0..TIMED_RUNS {
        let start = Instant::now();
        outputs = engine.forward(input).map_err(|e| e.to_string())?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    agree::finite(&outputs)?;
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

/// The engines and precisions `auto` tries for `request`, in order: f32 first (the first that
/// runs is the reference the others are compared with). Asked for a reduced precision, it still
/// runs the f32 engines, as references only.
fn candidates(files: Files<'_>, request: Request) -> Vec<(Backend, Precision)> {
    let mut all = vec![
        (Backend::OpenCv, Precision::F32),
        (Backend::OnnxRuntime, Precision::F32),
        (Backend::OpenVino, Precision::F32),
        (Backend::OpenVino, Precision::Bf16),
        (Backend::OnnxRuntime, Precision::Int8),
        (Backend::OpenVino, Precision::Int8),
    ];
    if files.others.onnx_int8.is_none() {
        all.retain(|c| c.1 != Precision::Int8);
    }
    if let Some(wanted) = request.precision {
        all.retain(|c| wanted.contains(c.1) || c.1 == Precision::F32);
    }
    all
}

/// Every engine and precision `auto` may take for `request`, loaded and timed on the check
/// `input`: the trials that ran, and why the others failed. Engines not installed are said once
/// per process. An error: the model's outputs do not fit what the step decodes.
fn run_candidates(
    files: Files<'_>,
    request: Request,
    check: &Check<'_>,
    input: &Mat,
) -> Result<(Vec<Trial>, Vec<String>), Diagnostic> {
    let label = &files.others.label;
    let mut failed: Vec<String> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut trials: Vec<Trial> = Vec::new();
    for (backend, precision) in candidates(files, request) {
        let candidate = format!("{} {}", backend.name(), precision.name());
        if let Err(why) = availability(backend) {
            if !missing.iter().any(|m| m.starts_with(backend.name())) {
                missing.push(format!("{}: {why}", backend.name()));
            }
            continue;
        }
        let t = load_engine(backend, precision, files, request.threads)
            .and_then(|engine| measure(backend, precision, engine, input));
        match t {
            Ok(t) => {
                // The model's outputs do not fit what the step decodes: no engine will do.
                if trials.is_empty() {
                    (check.fits)(&t.outputs)
                        .map_err(|why| Diagnostic::new(format!("{label}: {why}")))?;
                }
                trials.push(t);
            }
            Err(e) => failed.push(format!("{candidate} failed: {e}")),
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
    Ok((trials, failed))
}

/// `auto`: the fastest engine that loads and agrees with full precision on the check input.
pub(super) fn choose(
    files: Files<'_>,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    let label = &files.others.label;
    let input = (check.input)(&check.image)
        .map_err(|e| Diagnostic::new(format!("{label}: check image: {e}")))?;
    let key = (
        label.clone(),
        files.others.onnx.clone(),
        request,
        input.mat_size().iter().copied().collect(),
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
    let (trials, failed) = run_candidates(files, request, check, &input)?;
    let start = Instant::now();
    let mut clip: Option<Vec<Mat>> = None;
    let verdicts = judge(&trials, request.precision, check, &mut |i| {
        let frames = clip.get_or_insert_with(|| {
            check_clip(check.clip.as_ref().map(|(path, n)| (path.as_path(), *n)))
        });
        clip_tracks(&*trials[i].engine, check, frames)
    })
    .map_err(|e| Diagnostic::new(format!("{label}: {e}")))?;
    let judged_s = start.elapsed().as_secs_f64();
    let mut notes: Vec<String> = Vec::new();
    let mut agreed: Vec<Trial> = Vec::new();
    for (t, verdict) in trials.into_iter().zip(verdicts) {
        let ok = verdict.is_ok();
        notes.push(match verdict {
            Err(why) if why.starts_with("not judged") => {
                format!("{} {:.1} ms, {why}", t.name(), t.ms)
            }
            Err(why) => format!("{} {:.1} ms, disagreed: {why}", t.name(), t.ms),
            Ok(None) => format!("{} {:.1} ms", t.name(), t.ms),
            Ok(Some(clip)) => format!("{} {:.1} ms with {clip}", t.name(), t.ms),
        });
        // Asked for reduced precisions only, the f32 engines were references only.
        if ok && request.precision.is_none_or(|p| p.contains(t.precision)) {
            agreed.push(t);
        }
    }
    notes.extend(failed);
    let times: Vec<(Precision, f64)> = agreed.iter().map(|t| (t.precision, t.ms)).collect();
    let Some(best) = pick(&times, request.precision).map(|i| agreed.swap_remove(i)) else {
        let wanted = request.precision.map_or(String::new(), |p| {
            format!(" in {} that agrees with f32", p.names())
        });
        return Err(Diagnostic::new(format!(
            "{label}: no engine could run it{wanted} with {} ({})",
            check.input_name,
            notes.join("; ")
        )));
    };
    tracing::info!(
        model = %label,
        backend = best.backend.name(),
        precision = best.precision.name(),
        threads = request.threads,
        ms = format!("{:.1}", best.ms),
        judged_s = format!("{judged_s:.1}"),
        "network engine chosen by auto: the fastest that agrees with f32 (on the check image; a reduced precision also in its tracks on the check clip), the most precise within 15% of it ({})",
        notes.join("; ")
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

/// Whether each trial agrees with full precision: `Ok(None)` for an f32 engine that gives the
/// reference's outputs (the first f32 trial whose outputs are numbers is the reference),
/// `Ok(Some(tracks))` for a reduced precision that finds f32's boxes on the check image and keeps
/// its tracks on the clip (`tracks` says by how much), `Err(why)` otherwise (`why` starts with
/// "not judged" where it could not be, or need not be: it is never taken then either). `only`
/// is the precisions asked for, most wanted first, if any. `clip` runs trial `i` on the check clip; the reference
/// tracks come from the fastest f32 trial that agrees. An error: f32's check image could not be
/// decoded.
pub(super) fn judge(
    trials: &[Trial],
    only: Option<Precisions>,
    check: &Check<'_>,
    clip: &mut dyn FnMut(usize) -> Result<Vec<Vec<Track>>, String>,
) -> Result<Vec<Result<Option<String>, String>>, String> {
    let reference = trials
        .iter()
        .position(|t| t.precision == Precision::F32 && agree::finite(&t.outputs).is_ok());
    let mut verdicts: Vec<Result<Option<String>, String>> = trials
        .iter()
        .map(|t| {
            agree::finite(&t.outputs)?;
            match (t.precision, reference) {
                (Precision::F32, Some(r)) => {
                    agree::outputs_agree(&trials[r].outputs, &t.outputs).map(|()| None)
                }
                (_, None) => Err("not judged: no f32 engine to compare with".to_owned()),
                (_, Some(_)) if !check.real => {
                    Err("not judged: no check image with objects for this model".to_owned())
                }
                (_, Some(_)) => Ok(None),
            }
        })
        .collect();
    let Some(r) = reference else {
        return Ok(verdicts);
    };
    let boxes = |outputs: &[Tensor]| -> Result<Vec<BBox>, String> {
        Ok((check.detections)(&check.image, outputs)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|d| d.bbox)
            .collect())
    };
    let full = boxes(&trials[r].outputs).map_err(|e| format!("decoding the check image: {e}"))?;
    // The fastest f32 trial that agrees runs the clip for the reference tracks.
    let fastest_f32 = (0..trials.len())
        .filter(|&i| trials[i].precision == Precision::F32 && verdicts[i].is_ok())
        .min_by(|&a, &b| trials[a].ms.total_cmp(&trials[b].ms))
        .unwrap_or(r);
    // The reduced precisions, the most wanted (by default the most precise) and then the
    // fastest first. One that is never taken is not run on the clip: by default one no faster
    // than a more precise engine that agrees (`pick` prefers the more precise of two within 15%
    // of each other); in a list, one after a precision with an engine that agrees.
    let mut reduced: Vec<usize> = (0..trials.len())
        .filter(|&i| trials[i].precision != Precision::F32 && verdicts[i].is_ok())
        .collect();
    reduced.sort_by(|&a, &b| {
        let (a, b) = (&trials[a], &trials[b]);
        preference(a.precision, only)
            .cmp(&preference(b.precision, only))
            .then(a.ms.total_cmp(&b.ms))
    });
    let mut reference_tracks: Option<Result<Vec<Vec<Track>>, String>> = None;
    for i in reduced {
        let t = &trials[i];
        let better = (0..trials.len()).find(|&j| {
            let wanted = only.is_none_or(|p| p.contains(trials[j].precision));
            let before = preference(trials[j].precision, only) < preference(t.precision, only);
            wanted && before && (only.is_some() || trials[j].ms <= t.ms) && verdicts[j].is_ok()
        });
        verdicts[i] = (|| {
            agree::boxes_agree(&full, &boxes(&t.outputs)?)?;
            if let Some(j) = better {
                let why = if only.is_some() {
                    "comes first"
                } else {
                    "is as fast"
                };
                return Err(format!(
                    "not judged on the clip: never taken here, {} agrees and {why}",
                    trials[j].name()
                ));
            }
            if check.clip.is_none() {
                return Err("not judged: no check clip for this model".to_owned());
            }
            let theirs = clip(i)?;
            let ours = reference_tracks
                .get_or_insert_with(|| clip(fastest_f32))
                .as_ref()
                .map_err(|e| format!("f32 on the check clip: {e}"))?;
            agree::tracks_agree(ours, &theirs).map(|a| Some(a.to_string()))
        })();
    }
    Ok(verdicts)
}

/// How precise a precision is: 0 the most.
fn rank(p: Precision) -> u8 {
    match p {
        Precision::F32 => 0,
        Precision::Bf16 => 1,
        Precision::Int8 => 2,
    }
}

/// Where a precision stands: in the list asked for, its place; by default its rank (the most
/// precise first).
fn preference(p: Precision, only: Option<Precisions>) -> usize {
    only.map_or(usize::from(rank(p)), |list| {
        list.position(p).unwrap_or(usize::MAX)
    })
}

/// Of candidates that agreed, `(precision, ms)`: with a list asked for, the fastest of its
/// first precision that has one; by default the index of the most precise of those within
/// [`CLOSE`] of the fastest (the fastest among equals).
fn pick(times: &[(Precision, f64)], only: Option<Precisions>) -> Option<usize> {
    if only.is_some() {
        return times
            .iter()
            .enumerate()
            .min_by(|a, b| {
                preference(a.1.0, only)
                    .cmp(&preference(b.1.0, only))
                    .then(a.1.1.total_cmp(&b.1.1))
            })
            .map(|(i, _)| i);
    }
    let fastest = times.iter().map(|t| t.1).min_by(f64::total_cmp)?;
    times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.1 <= fastest * (1.0 + CLOSE))
        .min_by(|a, b| rank(a.1.0).cmp(&rank(b.1.0)).then(a.1.1.total_cmp(&b.1.1)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests;
