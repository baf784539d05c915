//! ONNX Runtime as an [`Engine`]: the ONNX file in one session per concurrent worker, f32, on
//! `threads` intra-op threads that block (not spin) when idle, graph optimizations on.

use std::path::{Path, PathBuf};

use opencv::core::Mat;
use ort::session::Session;
use ort::value::TensorRef;

use super::{Engine, Fill, Read, Tensor, View, blob_parts, runtimes, select_outputs};
use crate::steps::StepError;
use crate::steps::common::instances::Instances;

pub(super) struct OrtEngine {
    sessions: Instances<Session>,
    input: String,
    outputs: Vec<String>,
}

impl std::fmt::Debug for OrtEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtEngine")
            .field("sessions", &self.sessions)
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

fn session(path: &Path, threads: usize) -> Result<Session, String> {
    runtimes::guarded("onnxruntime", || {
        let fail = |e: ort::Error| format!("onnxruntime cannot read {}: {e}", path.display());
        let environment = runtimes::ort_environment().map_err(str::to_owned)?;
        let builder = Session::builder(environment)
            .map_err(fail)?
            .with_intra_threads(threads)
            .map_err(|e| fail(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.into()))?
            .with_intra_op_spinning(false)
            .map_err(|e| fail(e.into()))?
            .with_inter_op_spinning(false)
            .map_err(|e| fail(e.into()))?;
        let mut builder = builder;
        builder.commit_from_file(path).map_err(fail)
    })
}

impl OrtEngine {
    pub(super) fn load(
        path: &Path,
        outputs: Option<Vec<String>>,
        threads: usize,
    ) -> Result<Self, String> {
        let first = session(path, threads)?;
        let input = first
            .inputs()
            .first()
            .map(|i| i.name().to_owned())
            .ok_or_else(|| format!("{} has no input", path.display()))?;
        let all: Vec<String> = first
            .outputs()
            .iter()
            .map(|o| o.name().to_owned())
            .collect();
        let outputs = select_outputs(path, all, outputs)?;
        let path: PathBuf = path.to_owned();
        Ok(Self {
            sessions: Instances::new(first, move || {
                session(&path, threads).map_err(StepError::Other)
            }),
            input,
            outputs,
        })
    }
}

impl Engine for OrtEngine {
    /// The input in a buffer of its own (ONNX Runtime reads it in place), the outputs read
    /// where the session put them.
    fn forward_with(
        &self,
        shape: [usize; 4],
        fill: &mut Fill<'_>,
        read: &mut Read<'_>,
    ) -> Result<(), StepError> {
        let fail = |e: ort::Error| StepError::Other(format!("onnxruntime: {e}"));
        let mut data = vec![0.0_f32; shape.iter().product()];
        fill(&mut data)?;
        let tensor = TensorRef::from_array_view((shape.to_vec(), &data[..])).map_err(fail)?;
        self.sessions.with(|session| {
            let outputs = session
                .run(ort::inputs![self.input.as_str() => tensor])
                .map_err(fail)?;
            let views = self
                .outputs
                .iter()
                .map(|name| {
                    outputs[name.as_str()]
                        .try_extract_tensor::<f32>()
                        .map(|(shape, data)| View {
                            shape: shape
                                .iter()
                                .map(|d| usize::try_from(*d).unwrap_or(0))
                                .collect(),
                            data,
                        })
                        .map_err(fail)
                })
                .collect::<Result<Vec<_>, _>>()?;
            read(&views)
        })
    }

    fn forward(&self, input: &Mat) -> Result<Vec<Tensor>, StepError> {
        let (shape, data) = blob_parts(input)?;
        let fail = |e: ort::Error| StepError::Other(format!("onnxruntime: {e}"));
        let tensor = TensorRef::from_array_view((shape, data)).map_err(fail)?;
        self.sessions.with(|session| {
            let outputs = session
                .run(ort::inputs![self.input.as_str() => tensor])
                .map_err(fail)?;
            self.outputs
                .iter()
                .map(|name| {
                    let (shape, data) = outputs[name.as_str()]
                        .try_extract_tensor::<f32>()
                        .map_err(fail)?;
                    Ok(Tensor {
                        shape: shape
                            .iter()
                            .map(|d| usize::try_from(*d).unwrap_or(0))
                            .collect(),
                        data: data.to_vec(),
                    })
                })
                .collect()
        })
    }
}
