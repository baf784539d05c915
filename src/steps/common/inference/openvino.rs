//! OpenVINO as an [`Engine`]: the ONNX file compiled for the CPU device, f32 or bf16 (the
//! `INFERENCE_PRECISION_HINT`; bf16 runs on AMX or AVX-512 BF16 units, and is refused on a
//! CPU without them), one stream of `threads` threads per concurrent worker, no CPU pinning
//! (the pool's workers share the cores).
//!
//! OpenVINO runs fastest on a static shape, so each instance compiles the model for the shape
//! of the input it is given, and keeps what it compiled for the [`SHAPES_KEPT`] shapes it used
//! last: a step that sees several shapes (`keep_aspect` with a 4:3 and a 16:9 camera, YuNet at
//! each camera's own size) compiles each once, not at every change of shape.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use opencv::core::Mat;
use openvino::{CompiledModel, Core, DeviceType, InferRequest, PartialShape, RwPropertyKey};

use super::{Engine, Fill, Precision, Read, Tensor, View, blob_parts, runtimes, select_outputs};
use crate::steps::StepError;
use crate::steps::common::instances::Instances;

/// One worker's compiled model, for one input shape.
struct Compiled {
    shape: Vec<i64>,
    request: InferRequest,
    /// Kept alive as long as its request.
    _model: CompiledModel,
}

/// Shapes an instance keeps compiled, the least recently used dropped first: cameras of up to 8
/// sizes through one step cost one compile each (yolov12n at 640x480: 0.3 s), more than that
/// compile again as they come back, and the log says so once. Each kept shape costs memory in
/// every instance: yolov12n bf16 at 640 about 58 MB (two workers, two shapes: a peak RSS of
/// 442 MB against 325 MB with one, scripts/bench-shapes' pipeline).
pub(super) const SHAPES_KEPT: usize = 8;

pub(super) struct OvEngine {
    core: Mutex<Core>,
    path: PathBuf,
    precision: Precision,
    threads: usize,
    outputs: Vec<String>,
    /// Each instance's compiled shapes, the one used last at the end.
    compiled: Instances<Vec<Compiled>>,
    /// Compiles so far, of every instance (`Relaxed`: a count for logs and tests).
    compiles: AtomicUsize,
    /// Whether an instance dropped a compiled shape yet (said once).
    evicted: AtomicBool,
}

impl std::fmt::Debug for OvEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OvEngine")
            .field("path", &self.path)
            .field("precision", &self.precision)
            .field("threads", &self.threads)
            .field("compiled", &self.compiled)
            .finish_non_exhaustive()
    }
}

/// OpenVINO's error on one line: its exceptions span several, each naming a C++ file.
fn ov(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(|l| {
            l.split("Exception from ")
                .next()
                .unwrap_or_default()
                .trim()
                .trim_end_matches(':')
        })
        .filter(|l| !l.is_empty())
        .collect();
    format!("openvino: {}", lines.join("; "))
}

/// The CPU device's `OPTIMIZATION_CAPABILITIES`: `FP32 BF16 INT8 BIN EXPORT_IMPORT`.
fn capabilities(core: &Core) -> Result<String, String> {
    core.get_property(&DeviceType::CPU, &openvino::PropertyKey::DeviceCapabilities)
        .map_err(ov)
}

/// Whether capabilities say the CPU device computes in `precision`.
fn runs(capabilities: &str, precision: Precision) -> bool {
    let name = match precision {
        Precision::F32 => "FP32",
        Precision::Bf16 => "BF16",
        Precision::Int8 => "INT8",
    };
    capabilities
        .split([' ', ','])
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// The precisions OpenVINO's CPU device computes in on this machine (bf16 only with AMX or
/// AVX-512 BF16), or why it cannot be asked.
pub(super) fn precisions_here() -> Result<Vec<Precision>, String> {
    runtimes::openvino().map_err(str::to_owned)?;
    runtimes::guarded("openvino", || {
        let caps = capabilities(&Core::new().map_err(ov)?)?;
        Ok([Precision::F32, Precision::Bf16, Precision::Int8]
            .into_iter()
            .filter(|p| runs(&caps, *p))
            .collect())
    })
}

impl OvEngine {
    pub(super) fn load(
        path: &Path,
        outputs: Option<Vec<String>>,
        precision: Precision,
        threads: usize,
    ) -> Result<Self, String> {
        runtimes::guarded("openvino", || {
            let mut core = Core::new().map_err(ov)?;
            let cpu = DeviceType::CPU;
            if precision == Precision::Bf16 {
                let caps = capabilities(&core)?;
                if !runs(&caps, Precision::Bf16) {
                    return Err(format!(
                        "this CPU has no bf16 support (its capabilities: {caps})"
                    ));
                }
            }
            core.set_properties(
                &cpu,
                [
                    // The int8 copy runs its quantized layers in int8 whatever the hint: f32
                    // keeps its float head and decoding f32.
                    (
                        RwPropertyKey::HintInferencePrecision,
                        match precision {
                            Precision::Bf16 => "bf16",
                            Precision::F32 | Precision::Int8 => "f32",
                        },
                    ),
                    (RwPropertyKey::NumStreams, "1"),
                    (RwPropertyKey::InferenceNumThreads, &threads.to_string()),
                    (RwPropertyKey::HintEnableCpuPinning, "NO"),
                    (RwPropertyKey::HintPerformanceMode, "LATENCY"),
                ],
            )
            .map_err(ov)?;
            let model = core
                .read_model_from_file(&path.to_string_lossy(), "")
                .map_err(|e| format!("openvino cannot read {}: {e}", path.display()))?;
            let mut all = Vec::new();
            for i in 0..model.get_outputs_len().map_err(ov)? {
                all.push(
                    model
                        .get_output_by_index(i)
                        .and_then(|n| n.get_name())
                        .map_err(ov)?,
                );
            }
            let outputs = select_outputs(path, all, outputs)?;
            Ok(Self {
                core: Mutex::new(core),
                path: path.to_owned(),
                precision,
                threads,
                outputs,
                compiled: Instances::new(Vec::new(), || Ok::<_, StepError>(Vec::new())),
                compiles: AtomicUsize::new(0),
                evicted: AtomicBool::new(false),
            })
        })
    }

    /// Compiles the model for `shape`.
    fn compile(&self, shape: &[i64]) -> Result<Compiled, String> {
        runtimes::guarded("openvino", || {
            let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
            let mut model = core
                .read_model_from_file(&self.path.to_string_lossy(), "")
                .map_err(ov)?;
            let static_shape = PartialShape::new_static(shape.len() as i64, shape).map_err(ov)?;
            model.reshape_single_input(&static_shape).map_err(ov)?;
            let mut compiled = core.compile_model(&model, DeviceType::CPU).map_err(ov)?;
            let request = compiled.create_infer_request().map_err(ov)?;
            Ok(Compiled {
                shape: shape.to_vec(),
                request,
                _model: compiled,
            })
        })
    }
}

impl OvEngine {
    /// Runs `f` with this worker's request, compiled for `shape`.
    fn with_request<R>(
        &self,
        shape: &[i64],
        f: impl FnOnce(&mut InferRequest) -> Result<R, StepError>,
    ) -> Result<R, StepError> {
        self.compiled.with(|kept| {
            match kept.iter().position(|c| c.shape == shape) {
                // Used last already: nothing moves (the common case, one shape).
                Some(i) if i + 1 == kept.len() => {}
                Some(i) => {
                    let c = kept.remove(i);
                    kept.push(c);
                }
                None => {
                    kept.push(self.compile(shape).map_err(StepError::Other)?);
                    self.compiles.fetch_add(1, Ordering::Relaxed);
                    if kept.len() > SHAPES_KEPT {
                        kept.remove(0);
                        if !self.evicted.swap(true, Ordering::Relaxed) {
                            tracing::warn!(model = %self.path.display(),
                                "openvino: a step sees more than {SHAPES_KEPT} input shapes: the least recently used is compiled again when it comes back (resize the frames to fewer sizes)");
                        }
                    }
                }
            }
            let Some(compiled) = kept.last_mut() else {
                return Err(StepError::Other("openvino: no compiled model".to_owned()));
            };
            f(&mut compiled.request)
        })
    }

    /// How many times a model was compiled so far (every instance, every shape).
    #[cfg(test)]
    pub(super) fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// The request's input buffer, checked to hold `len` values.
    fn input(request: &InferRequest, len: usize) -> Result<openvino::Tensor, StepError> {
        let tensor = request.get_input_tensor().map_err(fail)?;
        let size = tensor.get_size().map_err(fail)?;
        if size != len {
            return Err(StepError::Other(format!(
                "openvino: an input of {len} values for {size}"
            )));
        }
        Ok(tensor)
    }

    /// The outputs the step decodes, in its order, as the request holds them.
    fn outputs(&self, request: &InferRequest) -> Result<Vec<openvino::Tensor>, StepError> {
        self.outputs
            .iter()
            .map(|name| request.get_tensor(name).map_err(fail))
            .collect()
    }
}

fn fail(e: impl std::fmt::Display) -> StepError {
    StepError::Other(ov(e))
}

impl Engine for OvEngine {
    fn forward(&self, input: &Mat) -> Result<Vec<Tensor>, StepError> {
        let (shape, data) = blob_parts(input)?;
        let shape: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
        self.with_request(&shape, |request| {
            let mut tensor = Self::input(request, data.len())?;
            tensor
                .get_data_mut::<f32>()
                .map_err(fail)?
                .copy_from_slice(data);
            request.infer().map_err(fail)?;
            self.outputs(request)?
                .iter()
                .map(|out| {
                    let shape = out.get_shape().map_err(fail)?;
                    Ok(Tensor {
                        shape: shape
                            .get_dimensions()
                            .iter()
                            .map(|d| usize::try_from(*d).unwrap_or(0))
                            .collect(),
                        data: out.get_data::<f32>().map_err(fail)?.to_vec(),
                    })
                })
                .collect()
        })
    }

    fn forward_with(
        &self,
        shape: [usize; 4],
        fill: &mut Fill<'_>,
        read: &mut Read<'_>,
    ) -> Result<(), StepError> {
        let dims = shape.map(|d| i64::try_from(d).unwrap_or(i64::MAX));
        self.with_request(&dims, |request| {
            let mut tensor = Self::input(request, shape.iter().product())?;
            fill(tensor.get_data_mut::<f32>().map_err(fail)?)?;
            request.infer().map_err(fail)?;
            let outputs = self.outputs(request)?;
            let views = outputs
                .iter()
                .map(|o| {
                    let shape = o.get_shape().map_err(fail)?;
                    Ok::<_, StepError>(View {
                        shape: shape
                            .get_dimensions()
                            .iter()
                            .map(|d| usize::try_from(*d).unwrap_or(0))
                            .collect(),
                        data: o.get_data::<f32>().map_err(fail)?,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            read(&views)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_openvino_error_is_one_line_without_its_cpp_files() {
        let e = "general error: Exception from src/inference/src/cpp/core.cpp:117:\nException from src/inference/src/dev/plugin.cpp:54:\ncan't protect\n";
        assert_eq!(super::ov(e), "openvino: general error; can't protect");
    }
}
