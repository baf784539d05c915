//! OpenCV's DNN module as an [`Engine`]: Darknet (cfg + weights) or ONNX files, f32, on the
//! threads `[executor] opencv_threads` gives OpenCV (process-wide).

use std::path::PathBuf;

use opencv::core::{self, Mat, MatTraitConst, MatTraitConstManual, Vector};
use opencv::dnn::{self, Net, NetTrait, NetTraitConst};

use super::{Engine, ModelFiles, Tensor};
use crate::steps::StepError;
use crate::steps::common::instances::Instances;

#[derive(Debug)]
pub(super) struct OpenCvEngine {
    nets: Instances<Net>,
    outputs: Vec<String>,
}

/// What OpenCV reads: a Darknet pair, else the ONNX file.
#[derive(Debug, Clone)]
enum Files {
    Darknet { weights: PathBuf, cfg: PathBuf },
    Onnx(PathBuf),
}

fn read(files: &Files) -> opencv::Result<Net> {
    let net = match files {
        Files::Darknet { weights, cfg } => {
            dnn::read_net_from_darknet(cfg, &weights.to_string_lossy())?
        }
        Files::Onnx(path) => dnn::read_net_from_onnx(path)?,
    };
    if net.empty()? {
        return Err(opencv::Error::new(
            core::StsError,
            "the network has no layers",
        ));
    }
    Ok(net)
}

impl OpenCvEngine {
    pub(super) fn load(model: &ModelFiles) -> Result<Self, String> {
        let files = match (&model.darknet, &model.onnx) {
            (Some((weights, cfg)), _) => Files::Darknet {
                weights: weights.clone(),
                cfg: cfg.clone(),
            },
            (None, Some(onnx)) => Files::Onnx(onnx.clone()),
            (None, None) => return Err(format!("{} names no model file", model.label)),
        };
        let shown = match &files {
            Files::Darknet { weights, .. } => weights.display().to_string(),
            Files::Onnx(path) => path.display().to_string(),
        };
        let net = read(&files)
            .map_err(|e| format!("{}: opencv cannot read {shown}: {e}", model.label))?;
        let outputs = match &model.outputs {
            Some(names) => names.clone(),
            None => net
                .get_unconnected_out_layers_names()
                .map_err(|e| format!("{}: {e}", model.label))?
                .iter()
                .collect(),
        };
        Ok(Self {
            nets: Instances::new(net, move || read(&files)),
            outputs,
        })
    }
}

impl Engine for OpenCvEngine {
    fn forward(&self, input: &Mat) -> Result<Vec<Tensor>, StepError> {
        let names: Vector<String> = self.outputs.iter().map(String::as_str).collect();
        let outputs = self.nets.with(|net| {
            net.set_input_def(input)?;
            let mut outputs = Vector::<Mat>::new();
            net.forward(&mut outputs, &names)?;
            Ok(outputs)
        })?;
        outputs
            .iter()
            .map(|m| {
                Ok(Tensor {
                    shape: m
                        .mat_size()
                        .iter()
                        .map(|d| usize::try_from(*d).unwrap_or(0))
                        .collect(),
                    data: m.data_typed::<f32>()?.to_vec(),
                })
            })
            .collect()
    }
}
