//! OpenVINO as an [`Engine`]: the ONNX file compiled for the CPU device, f32 or bf16 (the
//! `INFERENCE_PRECISION_HINT`; bf16 runs on AMX or AVX-512 BF16 units, and is refused on a
//! CPU without them), no CPU pinning (the pool's workers share the cores).
//!
//! OpenVINO runs fastest on a static shape, so the model is compiled for each shape of input it
//! is given (a camera that changed size; YuNet's input follows the image), once for all the
//! workers: one compiled model of as many streams of `threads` threads as the cores hold, and a
//! request of its own for each worker, whose synchronous inference runs in one of those
//! streams. Against a model compiled per worker (1 stream each) that is one compile instead of
//! one per worker (yolov12n at 640x480 bf16 on 2 cores: 0.3 s against 0.87 s, while a live
//! camera's first frames wait) and one model in memory, at the same throughput (51.0 against
//! 49.8 inferences/s).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use opencv::core::Mat;
use openvino::{CompiledModel, Core, DeviceType, InferRequest, PartialShape, RwPropertyKey};

use super::{Engine, Fill, Precision, Read, Tensor, View, blob_parts, runtimes, select_outputs};
use crate::steps::StepError;
use crate::steps::common::instances::Instances;

/// A model compiled for one input shape, shared by the workers.
type Shared = Arc<Mutex<CompiledModel>>;

/// Shapes whose compiled model is kept for the workers that will ask for it next; an older one
/// lives on only in the requests that hold it.
const SHAPES_KEPT: usize = 4;

/// One worker's request, for one input shape.
struct Compiled {
    shape: Vec<i64>,
    request: InferRequest,
    /// Kept alive as long as its request.
    _model: Shared,
}

pub(super) struct OvEngine {
    core: Mutex<Core>,
    path: PathBuf,
    precision: Precision,
    threads: usize,
    /// Streams of each compiled model: the cores over `threads`, at least one.
    streams: usize,
    outputs: Vec<String>,
    /// The compiled models, one a shape, the newest last.
    models: Mutex<Vec<(Vec<i64>, Shared)>>,
    /// Each worker's requests, one a shape it ran, the newest last.
    compiled: Instances<Vec<Compiled>>,
}

impl std::fmt::Debug for OvEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OvEngine")
            .field("path", &self.path)
            .field("precision", &self.precision)
            .field("threads", &self.threads)
            .field("streams", &self.streams)
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

impl OvEngine {
    pub(super) fn load(
        path: &Path,
        outputs: Option<Vec<String>>,
        precision: Precision,
        threads: usize,
    ) -> Result<Self, String> {
        let streams = std::thread::available_parallelism()
            .map_or(1, |n| n.get() / threads.max(1))
            .max(1);
        runtimes::guarded("openvino", || {
            let mut core = Core::new().map_err(ov)?;
            let cpu = DeviceType::CPU;
            if precision == Precision::Bf16 {
                let caps = core
                    .get_property(&cpu, &openvino::PropertyKey::DeviceCapabilities)
                    .map_err(ov)?;
                if !caps
                    .split([' ', ','])
                    .any(|c| c.eq_ignore_ascii_case("BF16"))
                {
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
                    (RwPropertyKey::NumStreams, &streams.to_string()),
                    (
                        RwPropertyKey::InferenceNumThreads,
                        &(streams * threads).to_string(),
                    ),
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
                streams,
                outputs,
                models: Mutex::new(Vec::new()),
                compiled: Instances::new(Vec::new(), || Ok::<_, StepError>(Vec::new())),
            })
        })
    }

    /// The model compiled for `shape`: compiled by the first worker to ask; a worker that asks
    /// meanwhile waits for it rather than compiling it again.
    fn model(&self, shape: &[i64]) -> Result<Shared, String> {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, model)) = models.iter().find(|(s, _)| s == shape) {
            return Ok(Arc::clone(model));
        }
        let compiled = runtimes::guarded("openvino", || {
            let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
            let mut model = core
                .read_model_from_file(&self.path.to_string_lossy(), "")
                .map_err(ov)?;
            let static_shape = PartialShape::new_static(shape.len() as i64, shape).map_err(ov)?;
            model.reshape_single_input(&static_shape).map_err(ov)?;
            core.compile_model(&model, DeviceType::CPU).map_err(ov)
        })?;
        let model = Arc::new(Mutex::new(compiled));
        if models.len() == SHAPES_KEPT {
            models.remove(0);
        }
        models.push((shape.to_vec(), Arc::clone(&model)));
        Ok(model)
    }

    /// A request of the model compiled for `shape`.
    fn compile(&self, shape: &[i64]) -> Result<Compiled, String> {
        let model = self.model(shape)?;
        let request = runtimes::guarded("openvino", || {
            model
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .create_infer_request()
                .map_err(ov)
        })?;
        Ok(Compiled {
            shape: shape.to_vec(),
            request,
            _model: model,
        })
    }
}

#[cfg(test)]
impl OvEngine {
    /// The shapes compiled models are kept for, oldest first.
    pub(super) fn shapes(&self) -> Vec<Vec<i64>> {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models.iter().map(|(s, _)| s.clone()).collect()
    }

    /// The requests the workers have made so far.
    pub(super) fn requests_made(&self) -> usize {
        self.compiled.made()
    }
}

impl OvEngine {
    /// Runs `f` with this worker's request, compiled for `shape`.
    fn with_request<R>(
        &self,
        shape: &[i64],
        f: impl FnOnce(&mut InferRequest) -> Result<R, StepError>,
    ) -> Result<R, StepError> {
        self.compiled.with(|requests| {
            match requests.iter().position(|c| c.shape == shape) {
                Some(i) => {
                    let newest = requests.remove(i);
                    requests.push(newest);
                }
                None => {
                    if requests.len() == SHAPES_KEPT {
                        requests.remove(0);
                    }
                    requests.push(self.compile(shape).map_err(StepError::Other)?);
                }
            }
            let Some(compiled) = requests.last_mut() else {
                return Err(StepError::Other("openvino: no compiled model".to_owned()));
            };
            f(&mut compiled.request)
        })
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
