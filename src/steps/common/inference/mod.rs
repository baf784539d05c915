//! The engines that run a network step's forward pass: OpenCV's DNN, ONNX Runtime and OpenVINO,
//! behind one [`Engine`] so `object_detection` and `face_detection` prepare their input and
//! decode their outputs the same way whichever runs.
//!
//! A step names `backend = "auto" | "opencv" | "onnxruntime" | "openvino"` and `precision =
//! "f32" | "bf16" | "int8"`. An engine asked for by name must be installed, load the model and
//! run it once on the step's input for the model's check image, or the step is a `validate`
//! error (naming the install step, the file, or the input it cannot take): a model never fails
//! frame by frame for a reason known when it is loaded. `auto` (the default) loads every engine it
//! can, runs each on the model's check input, and takes the most precise of the nearly fastest
//! whose result agrees with full precision ([`auto`]): f32 engines must give OpenCV's outputs (or
//! the first f32 engine's) within [`agree::F32_TOLERANCE`]; a reduced precision must find the same
//! objects on a check image that has some ([`agree::MIN_AGREEMENT`] of them, both ways, at IoU
//! 0.5) and keep f32's tracks on the model's check clip ([`agree::MIN_TRACK_AGREEMENT`]). Outputs
//! that are not numbers (NaN) agree with nothing. The log says what it took and why; a missing
//! runtime is one warning per process, and OpenCV always runs.
//!
//! Threads: an engine keeps one instance per worker that runs it at the same moment
//! ([`crate::steps::common::instances::Instances`]); each instance uses `threads` threads of its own (default 1:
//! the pool's workers are where parallelism comes from, so workers x threads stays at the
//! cores). ONNX Runtime's threads do not spin while idle; OpenVINO's are TBB's.

use std::fmt;
use std::path::PathBuf;

use opencv::core::{Mat, MatTraitConst, MatTraitConstManual, MatTraitManual};
use toml::Spanned;

use crate::spec::{Diagnostic, ParamDoc};
use crate::steps::StepError;
use crate::value::Detection;

mod agree;
mod auto;
mod check;
pub(in crate::steps) mod here;
mod kept;
mod onnxruntime;
mod opencv_dnn;
mod openvino;
pub(in crate::steps) mod runtimes;

pub(in crate::steps) use check::check_image;

/// Which engine runs a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::steps) enum Backend {
    OpenCv,
    OnnxRuntime,
    OpenVino,
}

impl Backend {
    pub(in crate::steps) fn name(self) -> &'static str {
        match self {
            Self::OpenCv => "opencv",
            Self::OnnxRuntime => "onnxruntime",
            Self::OpenVino => "openvino",
        }
    }
}

/// The arithmetic an engine computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::steps) enum Precision {
    F32,
    Bf16,
    /// The model's quantized copy (`onnx_int8`).
    Int8,
}

impl Precision {
    pub(in crate::steps) fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// The parameters every network step takes, documented once.
pub(in crate::steps) const BACKEND_DOC: ParamDoc = ParamDoc {
    name: "backend",
    ty: "string",
    default: "\"auto\"",
    doc: "\"auto\" (the fastest installed engine that agrees with f32 on the check image), \"opencv\", \"onnxruntime\" or \"openvino\"",
};
pub(in crate::steps) const PRECISION_DOC: ParamDoc = ParamDoc {
    name: "precision",
    ty: "string, or list of strings",
    default: "f32 (auto: f32, bf16 or int8, whichever agrees and is faster)",
    doc: "\"f32\", \"bf16\" (openvino, on a CPU with bf16 support) or \"int8\" (onnxruntime, openvino; a model with a quantized copy); a list is an order of preference: the first this CPU runs (with auto: that agrees), e.g. [\"bf16\", \"f32\"]",
};
pub(in crate::steps) const THREADS_DOC: ParamDoc = ParamDoc {
    name: "threads",
    ty: "integer in [1, 256]",
    default: "1",
    doc: "threads of one forward pass (onnxruntime, openvino); the pool's workers run frames side by side",
};

/// The precisions a step accepts, most wanted first: `precision = "bf16"` is a list of one,
/// `precision = ["bf16", "f32"]` takes bf16 where this CPU runs it and f32 elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::steps) struct Precisions([Option<Precision>; 3]);

impl Precisions {
    pub(in crate::steps) fn one(p: Precision) -> Self {
        Self([Some(p), None, None])
    }

    /// In order of preference.
    pub(in crate::steps) fn iter(self) -> impl Iterator<Item = Precision> {
        self.0.into_iter().flatten()
    }

    pub(in crate::steps) fn contains(self, p: Precision) -> bool {
        self.iter().any(|q| q == p)
    }

    /// Where `p` stands in the order of preference (`None`: not accepted).
    pub(in crate::steps) fn position(self, p: Precision) -> Option<usize> {
        self.iter().position(|q| q == p)
    }

    /// `bf16`, `bf16 or f32`.
    pub(in crate::steps) fn names(self) -> String {
        self.iter()
            .map(Precision::name)
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// `precision` as written: one name, or a list of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::steps) struct PrecisionText(Vec<String>);

impl<'de> serde::Deserialize<'de> for PrecisionText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = PrecisionText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a precision (\"f32\", \"bf16\" or \"int8\") or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PrecisionText(vec![v.to_owned()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(PrecisionText(names))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// What the step's table asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::steps) struct Request {
    /// `None`: auto.
    pub(in crate::steps) backend: Option<Backend>,
    /// `None`: f32, or for auto whichever agrees.
    pub(in crate::steps) precision: Option<Precisions>,
    pub(in crate::steps) threads: usize,
}

impl Request {
    /// Reads `backend`, `precision` and `threads` as the step's table gives them.
    pub(in crate::steps) fn parse(
        backend: Option<&Spanned<String>>,
        precision: Option<&Spanned<PrecisionText>>,
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
        let precision = precision
            .map(|p| {
                parse_precisions(backend, p.get_ref()).map_err(|why| Diagnostic::at(p.span(), why))
            })
            .transpose()?;
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

/// The precisions a step's `precision` names, checked against its backend.
fn parse_precisions(backend: Option<Backend>, text: &PrecisionText) -> Result<Precisions, String> {
    let mut list = [None; 3];
    if text.0.is_empty() {
        return Err(
            "precision is an empty list; name one or more of \"f32\", \"bf16\", \"int8\""
                .to_owned(),
        );
    }
    for (i, name) in text.0.iter().enumerate() {
        let p = match name.as_str() {
            "f32" => Precision::F32,
            "bf16" => Precision::Bf16,
            "int8" => Precision::Int8,
            other => {
                return Err(format!(
                    "unknown precision \"{other}\"; expected \"f32\", \"bf16\" or \"int8\""
                ));
            }
        };
        if list.contains(&Some(p)) {
            return Err(format!("precision \"{name}\" is listed twice"));
        }
        match (backend, p) {
            (Some(Backend::OpenCv), Precision::Bf16 | Precision::Int8) => {
                return Err("backend \"opencv\" computes in f32 only".to_owned());
            }
            (Some(Backend::OnnxRuntime), Precision::Bf16) => {
                return Err(
                    "backend \"onnxruntime\" runs f32 or int8; bf16 is openvino's".to_owned(),
                );
            }
            _ => {}
        }
        // Three names, none twice: `i` is below 3.
        if let Some(slot) = list.get_mut(i) {
            *slot = Some(p);
        }
    }
    Ok(Precisions(list))
}

/// A network's files, as the step found them.
#[derive(Debug, Clone)]
pub(in crate::steps) struct ModelFiles {
    /// How messages name the model: `model "yolov3_tiny_coco"`, `model_path "x.onnx"`.
    pub(in crate::steps) label: String,
    /// A Darknet network: (weights, cfg). OpenCV's DNN only.
    pub(in crate::steps) darknet: Option<(PathBuf, PathBuf)>,
    /// An ONNX file: every engine.
    pub(in crate::steps) onnx: Option<PathBuf>,
    /// Its quantized copy (QDQ), for `precision = "int8"`.
    pub(in crate::steps) onnx_int8: Option<PathBuf>,
    /// The outputs the step decodes, in its order; `None`: all, in the network's order.
    pub(in crate::steps) outputs: Option<Vec<String>>,
    /// Why OpenCV cannot run this network, known without trying (`auto` then does not try it,
    /// and OpenCV's importer does not print its errors on every load).
    pub(in crate::steps) opencv_refuses: Option<String>,
}

/// One output of a forward pass.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::steps) struct Tensor {
    pub(in crate::steps) shape: Vec<usize>,
    pub(in crate::steps) data: Vec<f32>,
}

/// Writes a network's input (NCHW f32) where the engine reads it.
pub(in crate::steps) type Fill<'a> = dyn FnMut(&mut [f32]) -> Result<(), StepError> + 'a;
/// Reads a forward pass's outputs, in the model files' order, where the engine keeps them.
pub(in crate::steps) type Read<'a> = dyn FnMut(&[View<'_>]) -> Result<(), StepError> + 'a;

/// An output where the engine keeps it: its shape and its values.
pub(in crate::steps) struct View<'a> {
    pub shape: Vec<usize>,
    pub data: &'a [f32],
}

impl<'a> From<&'a Tensor> for View<'a> {
    fn from(t: &'a Tensor) -> Self {
        Self {
            shape: t.shape.clone(),
            data: &t.data,
        }
    }
}

/// Runs a network. Shared by the workers: an engine hands each concurrent caller an instance of
/// its own.
pub(in crate::steps) trait Engine: Send + Sync + fmt::Debug {
    /// Runs the network on `input` (a 4-D NCHW f32 blob, as `dnn::blob_from_image` makes it)
    /// and returns the outputs the model files named, in their order.
    fn forward(&self, input: &Mat) -> Result<Vec<Tensor>, StepError>;

    /// Runs the network on an input of `shape` (NCHW f32) that `fill` writes, and hands the
    /// outputs to `read`: an engine that can lets `fill` write into its own input buffer and
    /// `read` see its output buffers, so neither is copied (at 640, 4.9 MB in and 2.8 MB out a
    /// frame). By default, a blob of its own and [`Engine::forward`].
    fn forward_with(
        &self,
        shape: [usize; 4],
        fill: &mut Fill<'_>,
        read: &mut Read<'_>,
    ) -> Result<(), StepError> {
        let dims: Vec<i32> = shape
            .iter()
            .map(|d| i32::try_from(*d).unwrap_or(i32::MAX))
            .collect();
        let mut blob = Mat::new_nd_with_default(&dims, opencv::core::CV_32F, 0.0.into())?;
        fill(blob.data_typed_mut::<f32>()?)?;
        let outputs = self.forward(&blob)?;
        let views: Vec<View<'_>> = outputs.iter().map(View::from).collect();
        read(&views)
    }
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
pub(in crate::steps) fn blob_parts(blob: &Mat) -> Result<(Vec<usize>, &[f32]), StepError> {
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
        Backend::OpenCv => match &opencv.opencv_refuses {
            Some(why) => Err(why.clone()),
            None => Ok(Box::new(opencv_dnn::OpenCvEngine::load(opencv)?)),
        },
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

/// A step's network input for an image, as it makes it on every frame.
pub(in crate::steps) type InputOf<'a> = dyn Fn(&Mat) -> Result<Mat, StepError> + 'a;
/// A step's decoding of a network's outputs for an image into the detections it would report.
pub(in crate::steps) type DetectionsOf<'a> =
    dyn Fn(&Mat, &[Tensor]) -> Result<Vec<Detection>, StepError> + 'a;
/// Whether outputs have the shapes the step decodes (its layout and class count): why not.
pub(in crate::steps) type FitsOf<'a> = dyn Fn(&[Tensor]) -> Result<(), String> + 'a;

/// What an engine is checked on when it is loaded, and `auto` judges it on: the model's check
/// image and clip, and the step's own input and decoding.
pub(in crate::steps) struct Check<'a> {
    /// The model's check image, or a synthetic picture.
    pub(in crate::steps) image: Mat,
    /// A real picture with objects the model should find (else a synthetic one: a reduced
    /// precision cannot be judged on it and is not taken).
    pub(in crate::steps) real: bool,
    /// The model's check clip (a picture of consecutive frames stacked, and how many), or none:
    /// then no reduced precision is taken by `auto`. Read only when a reduced precision is
    /// judged.
    pub(in crate::steps) clip: Option<(PathBuf, u32)>,
    pub(in crate::steps) input: &'a InputOf<'a>,
    /// How messages name the input the step gives: `input_size 416`.
    pub(in crate::steps) input_name: String,
    pub(in crate::steps) detections: &'a DetectionsOf<'a>,
    pub(in crate::steps) fits: &'a FitsOf<'a>,
    /// What else the detections depend on (classes, thresholds): part of the key `auto`'s
    /// decision is kept under.
    pub(in crate::steps) settings: String,
}

/// The engine a step runs, and what it is.
#[derive(Debug)]
pub(in crate::steps) struct Network {
    pub(in crate::steps) engine: Box<dyn Engine>,
    pub(in crate::steps) backend: Backend,
    pub(in crate::steps) precision: Precision,
}

impl Network {
    /// What runs it, for logs and `Debug`: `openvino bf16`.
    pub(in crate::steps) fn describe(&self) -> String {
        format!("{} {}", self.backend.name(), self.precision.name())
    }
}

/// Loads the network the request names; `auto` measures and checks the candidates.
pub(in crate::steps) fn load(
    files: &ModelFiles,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    load_with(files, files, request, check)
}

/// [`load`], with other files for OpenCV than for ONNX Runtime and OpenVINO.
pub(in crate::steps) fn load_with(
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
        return load_named(backend, files, request, check);
    }
    auto::choose(files, request, check)
}

/// The engine asked for by name, in the first precision of the request's that it runs here (a
/// CPU without bf16 takes the next in the list; the log says why the others were not taken).
fn load_named(
    backend: Backend,
    files: Files<'_>,
    request: Request,
    check: &Check<'_>,
) -> Result<Network, Diagnostic> {
    let precisions = request.precision.unwrap_or(Precisions::one(Precision::F32));
    availability(backend)
        .map_err(|why| Diagnostic::new(format!("backend \"{}\": {why}", backend.name())))?;
    let files_label = &files.others.label;
    let mut not_taken: Vec<(Precision, String)> = Vec::new();
    for precision in precisions.iter() {
        if let Some(why) = not_offered(backend, precision, files.others) {
            not_taken.push((precision, why));
            continue;
        }
        let engine = load_engine(backend, precision, files, request.threads).and_then(|engine| {
            first_run(&*engine, check)
                .map(|()| engine)
                .map_err(|e| format!("{files_label} with {}: {e}", check.input_name))
        });
        match engine {
            Ok(engine) => {
                if not_taken.is_empty() {
                    tracing::info!(model = %files_label, backend = backend.name(),
                        precision = precision.name(), threads = request.threads,
                        "network engine as asked for");
                } else {
                    let not_taken: Vec<String> = not_taken
                        .iter()
                        .map(|(p, why)| format!("{} not taken: {why}", p.name()))
                        .collect();
                    tracing::info!(model = %files_label, backend = backend.name(),
                        precision = precision.name(), threads = request.threads,
                        "network engine as asked for, the first precision of the list that runs here ({})",
                        not_taken.join("; "));
                }
                return Ok(Network {
                    engine,
                    backend,
                    precision,
                });
            }
            // Offered here, and failed: a broken file, outputs the step cannot read. Not a
            // reason to run in another precision: the step's error, whatever the list says.
            Err(why) => {
                return Err(Diagnostic::new(format!(
                    "backend \"{}\", precision {}: {why}",
                    backend.name(),
                    precision.name()
                )));
            }
        }
    }
    let why = match not_taken.as_slice() {
        [(_, why)] => why.clone(),
        all => {
            let each: Vec<String> = all
                .iter()
                .map(|(p, why)| format!("{}: {why}", p.name()))
                .collect();
            format!(
                "no precision of {} runs here ({})",
                precisions.names(),
                each.join("; ")
            )
        }
    };
    Err(Diagnostic::new(format!(
        "backend \"{}\": {why}",
        backend.name()
    )))
}

/// Why `backend` does not offer `precision` on this machine with these files (a CPU without
/// bf16, a model without its int8 copy): the next precision of a list is tried then, and the
/// log says why this one was not. `None`: it is offered, and a failure to load it is an error.
fn not_offered(backend: Backend, precision: Precision, files: &ModelFiles) -> Option<String> {
    match precision {
        Precision::F32 => None,
        Precision::Int8 if files.onnx_int8.is_none() => Some(format!(
            "{} has no int8 copy (precision \"int8\" runs a quantized ONNX file: make one with \
             scripts/quantize-onnx; set-up keeps one only where it agrees with the model)",
            files.label
        )),
        Precision::Bf16 | Precision::Int8 if backend == Backend::OpenVino => {
            match openvino::precisions_here() {
                Ok(here) if here.contains(&precision) => None,
                Ok(_) => Some(format!("this CPU has no {} support", precision.name())),
                Err(why) => Some(why),
            }
        }
        Precision::Bf16 | Precision::Int8 => None,
    }
}

/// Runs a loaded engine once on the step's input for the check image: an input it cannot take,
/// outputs that are not numbers or that the step cannot decode are found when the model is
/// loaded, not at the first frame.
fn first_run(engine: &dyn Engine, check: &Check<'_>) -> Result<(), String> {
    let input = (check.input)(&check.image).map_err(|e| format!("check image: {e}"))?;
    let outputs = engine.forward(&input).map_err(|e| e.to_string())?;
    agree::finite(&outputs)?;
    (check.fits)(&outputs)
}

/// Whether an engine's runtime is there: OpenCV always is.
fn availability(backend: Backend) -> Result<(), String> {
    match backend {
        Backend::OpenCv => Ok(()),
        Backend::OnnxRuntime => runtimes::onnxruntime().map(drop).map_err(str::to_owned),
        Backend::OpenVino => runtimes::openvino().map(drop).map_err(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spanned<T>(v: T) -> Spanned<T> {
        Spanned::new(0..1, v)
    }

    fn text(names: &[&str]) -> Spanned<PrecisionText> {
        spanned(PrecisionText(
            names.iter().map(|n| (*n).to_owned()).collect(),
        ))
    }

    #[test]
    fn a_request_reads_its_names_and_refuses_the_rest() {
        let r = Request::parse(None, None, None).unwrap();
        assert_eq!((r.backend, r.precision, r.threads), (None, None, 1));
        let r = Request::parse(
            Some(&spanned("openvino".to_owned())),
            Some(&text(&["bf16"])),
            Some(&spanned(2)),
        )
        .unwrap();
        assert_eq!(
            (r.backend, r.precision, r.threads),
            (
                Some(Backend::OpenVino),
                Some(Precisions::one(Precision::Bf16)),
                2
            )
        );
        for (backend, precision, threads, message) in [
            ("tensorrt", &["f32"][..], 1, "unknown backend \"tensorrt\""),
            ("opencv", &["bf16"], 1, "computes in f32 only"),
            ("onnxruntime", &["bf16"], 1, "bf16 is openvino's"),
            (
                "onnxruntime",
                &["int8", "bf16", "f32"],
                1,
                "bf16 is openvino's",
            ),
            ("opencv", &["int8"], 1, "computes in f32 only"),
            ("auto", &["f16"], 1, "unknown precision \"f16\""),
            ("auto", &["bf16", "f16"], 1, "unknown precision \"f16\""),
            ("auto", &[], 1, "precision is an empty list"),
            (
                "openvino",
                &["bf16", "f32", "bf16"],
                1,
                "\"bf16\" is listed twice",
            ),
            ("auto", &["f32"], 0, "threads must be from 1 to 256"),
        ] {
            let e = Request::parse(
                Some(&spanned(backend.to_owned())),
                Some(&text(precision)),
                Some(&spanned(threads)),
            )
            .unwrap_err();
            assert!(e.message.contains(message), "{}", e.message);
        }
    }

    #[test]
    fn a_precision_list_keeps_its_order_of_preference() {
        let r = Request::parse(None, Some(&text(&["int8", "bf16", "f32"])), None).unwrap();
        let list = r.precision.unwrap();
        assert_eq!(
            list.iter().collect::<Vec<_>>(),
            [Precision::Int8, Precision::Bf16, Precision::F32]
        );
        assert_eq!(list.names(), "int8 or bf16 or f32");
        assert_eq!(list.position(Precision::F32), Some(2));
        // As a pipeline file writes it: a name or a list of names.
        #[derive(serde::Deserialize)]
        struct Step {
            precision: PrecisionText,
        }
        let one: Step = toml::from_str("precision = \"bf16\"").unwrap();
        let two: Step = toml::from_str("precision = [\"bf16\", \"f32\"]").unwrap();
        assert_eq!(one.precision, PrecisionText(vec!["bf16".to_owned()]));
        assert_eq!(two.precision.0, ["bf16", "f32"]);
        let e = toml::from_str::<Step>("precision = 16").err().unwrap();
        assert!(e.to_string().contains("a precision"), "{e}");
    }
}

#[cfg(test)]
mod real_models;
