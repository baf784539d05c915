//! OpenVINO as an [`Engine`]: the ONNX file compiled for the CPU device, f32 or bf16 (the
//! `INFERENCE_PRECISION_HINT`; bf16 runs on AMX or AVX-512 BF16 units, and is refused on a
//! CPU without them), one stream of `threads` threads per concurrent worker, no CPU pinning
//! (the pool's workers share the cores).
//!
//! OpenVINO runs fastest on a static shape, so each instance compiles the model for the shape
//! of the input it is given, and keeps what it compiled for the shapes it used last, within
//! [`KEPT_BYTES`] for all the compiled models of the process ([`kept`](super::kept)): a step
//! that sees several shapes (`keep_aspect` with a 4:3 and a 16:9 camera, YuNet at each
//! camera's own size) compiles each once, not at every change of shape, and many shapes, steps
//! and workers together never keep more than that.
//!
//! What a shape costs is measured as it is compiled: the bytes the allocator has in use after
//! the compile and a first inference (where OpenVINO allocates the activations) less those
//! before. The allocator's count, not the resident set: memory freed before (a shape dropped)
//! and used again would not show in the resident set. Compiles take turns in the process
//! ([`COMPILING`]), so that each counts its own allocations; other threads' meanwhile (frames,
//! sinks) come and go and count little against tens of megabytes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::kept::{Budget, Got, Kept};

use opencv::core::Mat;
use openvino::{CompiledModel, Core, DeviceType, InferRequest, PartialShape, RwPropertyKey};

use super::{Engine, Fill, Precision, Read, Tensor, View, blob_parts, runtimes, select_outputs};
use crate::steps::StepError;
use crate::steps::common::instances::Instances;

/// One worker's compiled model, for one input shape.
struct Compiled {
    request: InferRequest,
    /// Kept alive as long as its request.
    _model: CompiledModel,
}

/// The bytes the compiled models of every OpenVINO step and worker may keep together, the
/// least recently used shape of the instance compiling a new one dropped first (each instance
/// keeps the one it runs on whatever its cost): a quarter of the systemd unit's `MemoryMax`
/// (4 GiB), the rest for frames, `motion`'s models and encoders. A compiled shape costs tens of
/// megabytes in every instance (measured by the allocator as below, yolov12n at 640x480 and
/// 640x352: 41 to 56 MiB bf16, 46 to 61 f32, 74 to 97 int8; YuNet f32 47 MiB at 1280x736, 97
/// at 1920x1088), and a step has an instance per worker running it: the 8 shapes an instance
/// kept before, on 4 workers, were 1.8 GiB of yolov12n, 3 GiB of YuNet near 1080p. The resident
/// set grows about a fifth more than the allocator's count (the machine code OpenVINO generates
/// is mapped outside it). Within the budget, cameras of several sizes cost one compile each
/// (yolov12n at 640x480: 0.3 s); past it, shapes compile again as they come back, and the log
/// says so once.
pub(super) const KEPT_BYTES: u64 = 1 << 30;

/// The budget of every OpenVINO engine of the process.
static BUDGET: Budget = Budget::new(KEPT_BYTES);

/// The least a compiled shape is taken to cost, whatever was measured (another thread freed
/// memory meanwhile; an allocator that cannot be asked): the smallest measured, YuNet at
/// 320x256, took 14 MB of resident memory.
pub(super) const MIN_SHAPE_BYTES: u64 = 8 << 20;

/// Held while a model is compiled and run once, so that one compile at a time measures the
/// allocator (see the module header). Compiles are rare: at start, and at a new shape.
static COMPILING: Mutex<()> = Mutex::new(());

/// The bytes the allocator has handed out and not been given back (glibc's `mallinfo2`:
/// in its arenas and mapped on their own); `None` where the allocator is not glibc's.
fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics (taking each arena's lock in
        // turn) and returns them by value; it has no preconditions.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

pub(super) struct OvEngine {
    core: Mutex<Core>,
    path: PathBuf,
    precision: Precision,
    threads: usize,
    outputs: Vec<String>,
    /// Each instance's compiled shapes, within `budget` with every other's.
    compiled: Instances<Kept<Compiled>>,
    budget: &'static Budget,
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
                compiled: Instances::new(Kept::new(&BUDGET), || {
                    Ok::<_, StepError>(Kept::new(&BUDGET))
                }),
                budget: &BUDGET,
                compiles: AtomicUsize::new(0),
                evicted: AtomicBool::new(false),
            })
        })
    }

    /// The same engine counting its compiled shapes against `budget` instead of the process's.
    #[cfg(test)]
    pub(super) fn with_budget(mut self, budget: &'static Budget) -> Self {
        self.compiled = Instances::new(Kept::new(budget), move || {
            Ok::<_, StepError>(Kept::new(budget))
        });
        self.budget = budget;
        self
    }

    /// Compiles the model for `shape` and runs it once (on zeros), and measures what that
    /// took (see the module header).
    fn compile(&self, shape: &[i64]) -> Result<(Compiled, u64), String> {
        let _turn = COMPILING.lock().unwrap_or_else(PoisonError::into_inner);
        let before = heap_in_use();
        let compiled = runtimes::guarded("openvino", || {
            let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
            let mut model = core
                .read_model_from_file(&self.path.to_string_lossy(), "")
                .map_err(ov)?;
            let static_shape = PartialShape::new_static(shape.len() as i64, shape).map_err(ov)?;
            model.reshape_single_input(&static_shape).map_err(ov)?;
            let mut compiled = core.compile_model(&model, DeviceType::CPU).map_err(ov)?;
            drop(core);
            let mut request = compiled.create_infer_request().map_err(ov)?;
            request
                .get_input_tensor()
                .and_then(|mut t| t.get_data_mut::<f32>().map(|d| d.fill(0.0)))
                .map_err(ov)?;
            request.infer().map_err(ov)?;
            Ok(Compiled {
                request,
                _model: compiled,
            })
        })?;
        let took = before
            .zip(heap_in_use())
            .map_or(0, |(before, after)| after.saturating_sub(before));
        let bytes = took.max(MIN_SHAPE_BYTES);
        tracing::debug!(model = %self.path.display(), ?shape, mib = bytes >> 20,
            "openvino: compiled the model for a new input shape");
        Ok((compiled, bytes))
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
            let (compiled, got) = kept
                .get(shape, || self.compile(shape))
                .map_err(StepError::Other)?;
            if let Got::Made { dropped } = got {
                self.compiles.fetch_add(1, Ordering::Relaxed);
                if dropped > 0 && !self.evicted.swap(true, Ordering::Relaxed) {
                    tracing::warn!(model = %self.path.display(), kept_mib = self.budget.kept() >> 20,
                        "openvino: the compiled models of all steps and workers would take more than {} MiB: the shapes used least recently are dropped and compiled again when they come back (resize the frames to fewer sizes)",
                        self.budget.max() >> 20);
                }
            }
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
