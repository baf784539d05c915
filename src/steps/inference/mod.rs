//! The engines that run a network step's forward pass: OpenCV's DNN, ONNX Runtime and OpenVINO,
//! behind one [`Engine`] so `object_detection` and `face_detection` prepare their input and
//! decode their outputs the same way whichever runs.
//!
//! A step names `backend = "auto" | "opencv" | "onnxruntime" | "openvino"` and `precision =
//! "f32" | "bf16"`. An engine asked for by name must be installed and load the model, or the
//! step is a `validate` error that names the install step. `auto` (the default) loads every
//! engine it can, runs each on the model's check input, and takes the fastest whose result
//! agrees with full precision ([`choose`]): f32 engines must give OpenCV's outputs (or the first
//! f32 engine's) within [`F32_TOLERANCE`]; a reduced precision must find the same objects on a
//! check image that has some ([`MIN_AGREEMENT`] of them, both ways, at IoU 0.5). The log says
//! what it took and why; a missing runtime is one warning per process, and OpenCV always runs.
//!
//! Threads: an engine keeps one instance per worker that runs it at the same moment
//! ([`super::instances::Instances`]); each instance uses `threads` threads of its own (default 1:
//! the pool's workers are where parallelism comes from, so workers x threads stays at the
//! cores). ONNX Runtime's threads do not spin while idle; OpenVINO's are TBB's.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::Instant;

use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, MatTraitManual};
use toml::Spanned;

use super::StepError;
use crate::spec::{Diagnostic, ParamDoc};
use crate::value::BBox;

mod onnxruntime;
mod opencv_dnn;
mod openvino;
pub(super) mod runtimes;

/// Which engine runs a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Backend {
    OpenCv,
    OnnxRuntime,
    OpenVino,
}

impl Backend {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::OpenCv => "opencv",
            Self::OnnxRuntime => "onnxruntime",
            Self::OpenVino => "openvino",
        }
    }
}

/// The arithmetic an engine computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Precision {
    F32,
    Bf16,
    /// The model's quantized copy (`onnx_int8`).
    Int8,
}

impl Precision {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// The parameters every network step takes, documented once.
pub(super) const BACKEND_DOC: ParamDoc = ParamDoc {
    name: "backend",
    ty: "string",
    default: "\"auto\"",
    doc: "\"auto\" (the fastest installed engine that agrees with f32 on the check image), \"opencv\", \"onnxruntime\" or \"openvino\"",
};
pub(super) const PRECISION_DOC: ParamDoc = ParamDoc {
    name: "precision",
    ty: "string",
    default: "f32 (auto: f32, bf16 or int8, whichever agrees and is faster)",
    doc: "\"f32\", \"bf16\" (openvino, on a CPU with bf16 support) or \"int8\" (onnxruntime, openvino; a model with a quantized copy)",
};
pub(super) const THREADS_DOC: ParamDoc = ParamDoc {
    name: "threads",
    ty: "integer",
    default: "1",
    doc: "threads of one forward pass (onnxruntime, openvino); the pool's workers run frames side by side",
};

/// What the step's table asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Request {
    /// `None`: auto.
    pub(super) backend: Option<Backend>,
    /// `None`: f32, or for auto whichever agrees.
    pub(super) precision: Option<Precision>,
    pub(super) threads: usize,
}

impl Request {
    /// Reads `backend`, `precision` and `threads` as the step's table gives them.
    pub(super) fn parse(
        backend: Option<&Spanned<String>>,
        precision: Option<&Spanned<String>>,
        threads: Option<&Spanned<u32>>,
    ) -> Result<Self, Diagnostic> {
        let backend = match backend {
            None => None,
            Some(b) => match b.get_ref().as_str() {
                "auto" => None,
                "opencv" => Some(Backend::OpenCv),
                "onnxruntime" => Some(Backend::OnnxRuntime),
                "openvino" => Some(Backend::OpenVino),
                other => {
                    return Err(Diagnostic::at(
                        b.span(),
                        format!(
                            "unknown backend \"{other}\"; expected \"auto\", \"opencv\", \"onnxruntime\" or \"openvino\""
                        ),
                    ));
                }
            },
        };
        let precision = match precision {
            None => None,
            Some(p) => {
                let precision = match p.get_ref().as_str() {
                    "f32" => Precision::F32,
                    "bf16" => Precision::Bf16,
                    "int8" => Precision::Int8,
                    other => {
                        return Err(Diagnostic::at(
                            p.span(),
                            format!(
                                "unknown precision \"{other}\"; expected \"f32\", \"bf16\" or \"int8\""
                            ),
                        ));
                    }
                };
                let refused = match (backend, precision) {
                    (Some(Backend::OpenCv), Precision::Bf16 | Precision::Int8) => {
                        Some("backend \"opencv\" computes in f32 only")
                    }
                    (Some(Backend::OnnxRuntime), Precision::Bf16) => {
                        Some("backend \"onnxruntime\" runs f32 or int8; bf16 is openvino's")
                    }
                    _ => None,
                };
                if let Some(why) = refused {
                    return Err(Diagnostic::at(p.span(), why));
                }
                Some(precision)
            }
        };
        let threads = match threads {
            None => 1,
            Some(t) if (1..=256).contains(t.get_ref()) => *t.get_ref() as usize,
            Some(t) => {
                return Err(Diagnostic::at(
                    t.span(),
                    format!("threads must be from 1 to 256, not {}", t.get_ref()),
                ));
            }
        };
        Ok(Self {
            backend,
            precision,
            threads,
        })
    }
}

/// A network's files, as the step found them.
#[derive(Debug, Clone)]
pub(super) struct ModelFiles {
    /// How messages name the model: `model "yolov3_tiny_coco"`, `model_path "x.onnx"`.
    pub(super) label: String,
    /// A Darknet network: (weights, cfg). OpenCV's DNN only.
    pub(super) darknet: Option<(PathBuf, PathBuf)>,
    /// An ONNX file: every engine.
    pub(super) onnx: Option<PathBuf>,
    /// Its quantized copy (QDQ), for `precision = "int8"`.
    pub(super) onnx_int8: Option<PathBuf>,
    /// The outputs the step decodes, in its order; `None`: all, in the network's order.
    pub(super) outputs: Option<Vec<String>>,
}

/// One output of a forward pass.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tensor {
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<f32>,
}

/// Runs a network. Shared by the workers: an engine hands each concurrent caller an instance of
/// its own.
pub(super) trait Engine: Send + Sync + fmt::Debug {
    /// Runs the network on `input` (a 4-D NCHW f32 blob, as `dnn::blob_from_image` makes it)
    /// and returns the outputs the model files named, in their order.
    fn forward(&self, input: &Mat) -> Result<Vec<Tensor>, StepError>;
}

/// The outputs an engine returns: those `wanted` names (all checked to exist in `all`), else
/// all of them in the network's order.
fn select_outputs(
    path: &std::path::Path,
    all: Vec<String>,
    wanted: Option<Vec<String>>,
) -> Result<Vec<String>, String> {
    let Some(wanted) = wanted else {
        return Ok(all);
    };
    match wanted.iter().find(|w| !all.contains(w)) {
        Some(missing) => Err(format!(
            "{} has no output \"{missing}\" (its outputs: {})",
            path.display(),
            all.join(", ")
        )),
        None => Ok(wanted),
    }
}

/// The shape and values of a blob.
pub(super) fn blob_parts(blob: &Mat) -> Result<(Vec<usize>, &[f32]), StepError> {
    let shape: Vec<usize> = blob
        .mat_size()
        .iter()
        .map(|d| usize::try_from(*d).unwrap_or(0))
        .collect();
    Ok((shape, blob.data_typed::<f32>()?))
}

/// The model files each engine reads: OpenCV may take others than the rest (Darknet files, a
/// network whose declared input size OpenCV ignores).
#[derive(Debug, Clone, Copy)]
struct Files<'a> {
    opencv: &'a ModelFiles,
    others: &'a ModelFiles,
}

/// Loads the model in one engine.
fn load_engine(
    backend: Backend,
    precision: Precision,
    files: Files<'_>,
    threads: usize,
) -> Result<Box<dyn Engine>, String> {
    let Files {
        opencv,
        others: files,
    } = files;
    availability(backend)?;
    let onnx = || {
        match precision {
        Precision::Int8 => files.onnx_int8.clone().ok_or_else(|| {
            format!(
                "{} has no int8 copy (precision \"int8\" runs a quantized ONNX file: make one with scripts/quantize-onnx)",
                files.label
            )
        }),
        Precision::F32 | Precision::Bf16 => files.onnx.clone().ok_or_else(|| {
            format!(
                "{} has no ONNX file ({} runs ONNX only; convert a Darknet model with scripts/darknet2onnx)",
                files.label,
                backend.name()
            )
        }),
    }
    };
    match backend {
        Backend::OpenCv => Ok(Box::new(opencv_dnn::OpenCvEngine::load(opencv)?)),
        Backend::OnnxRuntime => Ok(Box::new(onnxruntime::OrtEngine::load(
            &onnx()?,
            files.outputs.clone(),
            threads,
        )?)),
        Backend::OpenVino => Ok(Box::new(openvino::OvEngine::load(
            &onnx()?,
            files.outputs.clone(),
            precision,
            threads,
        )?)),
    }
}

/// A step's decoding of a network's outputs into the boxes it would report.
pub(super) type BoxesOf<'a> = dyn Fn(&[Tensor]) -> Result<Vec<BBox>, StepError> + 'a;

/// What `auto` judges an engine on: the step's own input for the model's check image, and the
/// step's own decoding of the outputs into boxes.
pub(super) struct Check<'a> {
    pub(super) input: Mat,
    /// A real picture with objects the model should find (else a synthetic one: a reduced
    /// precision cannot be judged on it and is not taken).
    pub(super) real: bool,
    pub(super) boxes: &'a BoxesOf<'a>,
    /// What else the boxes depend on (classes, thresholds): part of the key `auto`'s decision
    /// is kept under.
    pub(super) settings: String,
}

/// The engine a step runs, and what it is.
#[derive(Debug)]
pub(super) struct Network {
    pub(super) engine: Box<dyn Engine>,
    pub(super) backend: Backend,
    pub(super) precision: Precision,
}

/// The picture `auto` judges engines on: the model's check image (`real`), else a synthetic
/// one (a gradient with a few shapes: enough to compare f32 outputs, not to judge boxes).
pub(super) fn check_image(path: Option<&std::path::Path>) -> (Mat, bool) {
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

impl Network {
    /// What runs it, for logs and `Debug`: `openvino bf16`.
    pub(super) fn describe(&self) -> String {
        format!("{} {}", self.backend.name(), self.precision.name())
    }
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

/// Loads the network the request names; `auto` measures and checks the candidates.
pub(super) fn load(
    files: &ModelFiles,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    load_with(files, files, request, check)
}

/// [`load`], with other files for OpenCV than for ONNX Runtime and OpenVINO.
pub(super) fn load_with(
    files: &ModelFiles,
    opencv: &ModelFiles,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    let files = Files {
        opencv,
        others: files,
    };
    if let Some(backend) = request.backend {
        let precision = request.precision.unwrap_or(Precision::F32);
        availability(backend)
            .map_err(|why| Diagnostic::new(format!("backend \"{}\": {why}", backend.name())))?;
        let files_label = &files.others.label;
        let engine = load_engine(backend, precision, files, request.threads)
            .map_err(|e| Diagnostic::new(format!("backend \"{}\": {e}", backend.name())))?;
        tracing::info!(model = %files_label, backend = backend.name(), precision = precision.name(),
            threads = request.threads, "network engine as asked for");
        return Ok(Network {
            engine,
            backend,
            precision,
        });
    }
    choose(files, request, check)
}

/// Whether an engine's runtime is there: OpenCV always is.
fn availability(backend: Backend) -> Result<(), String> {
    match backend {
        Backend::OpenCv => Ok(()),
        Backend::OnnxRuntime => runtimes::onnxruntime().map(drop).map_err(str::to_owned),
        Backend::OpenVino => runtimes::openvino().map(drop).map_err(str::to_owned),
    }
}

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
fn choose(files: Files<'_>, request: Request, check: &Check<'_>) -> Result<Network, Diagnostic> {
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

    fn spanned<T>(v: T) -> Spanned<T> {
        Spanned::new(0..1, v)
    }

    #[test]
    fn a_request_reads_its_names_and_refuses_the_rest() {
        let r = Request::parse(None, None, None).unwrap();
        assert_eq!((r.backend, r.precision, r.threads), (None, None, 1));
        let r = Request::parse(
            Some(&spanned("openvino".to_owned())),
            Some(&spanned("bf16".to_owned())),
            Some(&spanned(2)),
        )
        .unwrap();
        assert_eq!(
            (r.backend, r.precision, r.threads),
            (Some(Backend::OpenVino), Some(Precision::Bf16), 2)
        );
        for (backend, precision, threads, message) in [
            ("tensorrt", "f32", 1, "unknown backend \"tensorrt\""),
            ("opencv", "bf16", 1, "computes in f32 only"),
            ("onnxruntime", "bf16", 1, "bf16 is openvino's"),
            ("opencv", "int8", 1, "computes in f32 only"),
            ("auto", "f16", 1, "unknown precision"),
            ("auto", "f32", 0, "threads must be from 1 to 256"),
        ] {
            let e = Request::parse(
                Some(&spanned(backend.to_owned())),
                Some(&spanned(precision.to_owned())),
                Some(&spanned(threads)),
            )
            .unwrap_err();
            assert!(e.message.contains(message), "{}", e.message);
        }
    }

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

/// The real models on the real runtimes (`scripts/fetch-assets`, `scripts/fetch-runtimes`).
#[cfg(test)]
mod engines {
    use super::*;
    use crate::steps::models::models_dir;

    fn yolo_blob(side: i32) -> Mat {
        let (image, real) = check_image(Some(&models_dir().join("check-street.png")));
        assert!(real, "models/check-street.png: run scripts/fetch-assets");
        opencv::dnn::blob_from_image(
            &image,
            1.0 / 255.0,
            opencv::core::Size::new(side, side),
            opencv::core::Scalar::default(),
            true,
            false,
            opencv::core::CV_32F,
        )
        .unwrap()
    }

    fn max_difference(a: &[Tensor], b: &[Tensor]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                assert_eq!(x.data.len(), y.data.len());
                x.data
                    .iter()
                    .zip(&y.data)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f32::max)
            })
            .fold(0.0, f32::max)
    }

    /// Every f32 engine against OpenCV on `files`, for `input`.
    fn f32_engines_match_opencv(files: Files<'_>, input: &Mat) {
        let reference = load_engine(Backend::OpenCv, Precision::F32, files, 1)
            .unwrap()
            .forward(input)
            .unwrap();
        assert!(reference.iter().any(|t| t.data.iter().any(|v| *v > 0.5)));
        for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
            availability(backend).unwrap();
            let engine = load_engine(backend, Precision::F32, files, 1).unwrap();
            let outputs = engine.forward(input).unwrap();
            let shapes = |t: &[Tensor]| t.iter().map(|t| t.data.len()).collect::<Vec<_>>();
            assert_eq!(shapes(&outputs), shapes(&reference), "{}", backend.name());
            let worst = max_difference(&reference, &outputs);
            assert!(
                worst <= 1e-4,
                "{} {}: outputs differ from OpenCV's by {worst}",
                files.others.label,
                backend.name()
            );
        }
    }

    #[test]
    fn f32_engines_give_opencvs_outputs_within_1e_4() {
        let dir = models_dir();
        let yolo = ModelFiles {
            label: "yolov3_tiny_coco".to_owned(),
            darknet: Some((dir.join("yolov3-tiny.weights"), dir.join("yolov3-tiny.cfg"))),
            onnx: Some(dir.join("yolov3-tiny.onnx")),
            onnx_int8: None,
            outputs: Some(vec!["yolo_16".to_owned(), "yolo_23".to_owned()]),
        };
        let files = Files {
            opencv: &yolo,
            others: &yolo,
        };
        for side in [320, 416] {
            f32_engines_match_opencv(files, &yolo_blob(side));
        }
        let outputs: Vec<String> = ["cls_8", "obj_16", "bbox_32", "kps_8"]
            .map(str::to_owned)
            .to_vec();
        let yunet = ModelFiles {
            label: "yunet_face".to_owned(),
            darknet: None,
            onnx: Some(dir.join("face_detection_yunet_2023mar-dynamic.onnx")),
            onnx_int8: None,
            outputs: Some(outputs),
        };
        let yunet_opencv = ModelFiles {
            onnx: Some(dir.join("face_detection_yunet_2023mar.onnx")),
            ..yunet.clone()
        };
        let (image, _) = check_image(Some(&dir.join("check-faces.png")));
        let mut padded = Mat::default();
        let pad = |n: i32| (n + 31) / 32 * 32 - n;
        opencv::core::copy_make_border(
            &image,
            &mut padded,
            0,
            pad(image.rows()),
            0,
            pad(image.cols()),
            opencv::core::BORDER_CONSTANT,
            opencv::core::Scalar::default(),
        )
        .unwrap();
        let blob = opencv::dnn::blob_from_image_def(&padded).unwrap();
        f32_engines_match_opencv(
            Files {
                opencv: &yunet_opencv,
                others: &yunet,
            },
            &blob,
        );
    }

    #[test]
    fn an_engine_compiled_for_one_size_runs_another() {
        let dir = models_dir();
        let yolo = ModelFiles {
            label: "yolov3_tiny_coco".to_owned(),
            darknet: None,
            onnx: Some(dir.join("yolov3-tiny.onnx")),
            onnx_int8: None,
            outputs: None,
        };
        let files = Files {
            opencv: &yolo,
            others: &yolo,
        };
        for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
            let engine = load_engine(backend, Precision::F32, files, 1).unwrap();
            for side in [320, 416, 320] {
                let outputs = engine.forward(&yolo_blob(side)).unwrap();
                // Rows of 85 per cell and anchor, at strides 32 and 16.
                let cells = |stride: i32| ((side / stride) * (side / stride) * 3 * 85) as usize;
                assert_eq!(
                    outputs.iter().map(|t| t.data.len()).collect::<Vec<_>>(),
                    vec![cells(32), cells(16)],
                    "{} at {side}",
                    backend.name()
                );
            }
        }
    }

    #[test]
    fn int8_runs_the_quantized_copy_and_only_where_there_is_one() {
        let dir = models_dir();
        let mut yolo = ModelFiles {
            label: "yolov3_tiny_coco".to_owned(),
            darknet: None,
            onnx: Some(dir.join("yolov3-tiny.onnx")),
            onnx_int8: Some(dir.join("yolov3-tiny-int8.onnx")),
            outputs: None,
        };
        let blob = yolo_blob(320);
        for backend in [Backend::OnnxRuntime, Backend::OpenVino] {
            let files = Files {
                opencv: &yolo,
                others: &yolo,
            };
            let run = |precision| {
                load_engine(backend, precision, files, 1)
                    .unwrap()
                    .forward(&blob)
                    .unwrap()
            };
            let (full, quantized) = (run(Precision::F32), run(Precision::Int8));
            // Quantization moves the values (the same file would give them to 1e-6).
            let moved = max_difference(&full, &quantized);
            assert!(
                moved > 1e-3,
                "{}: int8 differs by only {moved}",
                backend.name()
            );
        }
        yolo.onnx_int8 = None;
        let files = Files {
            opencv: &yolo,
            others: &yolo,
        };
        let e = load_engine(Backend::OnnxRuntime, Precision::Int8, files, 1).unwrap_err();
        assert!(e.contains("has no int8 copy"), "{e}");
    }
}
