//! `filter`: keeps the detections that match; can end the branch when none is left.

use std::sync::Arc;

use serde::Deserialize;

use super::{Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Value, ValueType};

const DETECTIONS: &[Port] = &[Port {
    name: "detections",
    ty: ValueType::Detections,
    optional: false,
}];

pub(super) static KIND: StepKind = StepKind {
    name: "filter",
    summary: "keep detections by class, confidence and area; optionally end the branch when none is left",
    inputs: DETECTIONS,
    outputs: DETECTIONS,
    params: &[
        ParamDoc {
            name: "classes",
            ty: "list of strings",
            default: "all",
            doc: "classes to keep",
        },
        ParamDoc {
            name: "min_confidence",
            ty: "float",
            default: "0.0",
            doc: "lowest confidence kept",
        },
        ParamDoc {
            name: "min_area",
            ty: "float",
            default: "0.0",
            doc: "smallest box kept, in square pixels",
        },
        ParamDoc {
            name: "skip_if_empty",
            ty: "bool",
            default: "false",
            doc: "when nothing is kept, skip the steps that read this one for this frame",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    classes: Option<Vec<String>>,
    min_confidence: Option<f32>,
    min_area: Option<f32>,
    skip_if_empty: Option<bool>,
}

#[derive(Debug)]
struct Filter {
    classes: Option<Vec<Arc<str>>>,
    min_confidence: f32,
    min_area: f32,
    skip_if_empty: bool,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    Ok(Box::new(Filter {
        classes: c.classes.map(|cs| cs.into_iter().map(Arc::from).collect()),
        min_confidence: c.min_confidence.unwrap_or(0.0),
        min_area: c.min_area.unwrap_or(0.0),
        skip_if_empty: c.skip_if_empty.unwrap_or(false),
    }))
}

impl Step for Filter {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let kept: Vec<_> = input
            .detections(0)?
            .iter()
            .filter(|d| {
                d.confidence >= self.min_confidence
                    && d.bbox.width * d.bbox.height >= self.min_area
                    && self.classes.as_ref().is_none_or(|cs| cs.contains(&d.class))
            })
            .cloned()
            .collect();
        if kept.is_empty() && self.skip_if_empty {
            return Ok(StepOutput::EndBranch);
        }
        Ok(StepOutput::Values(vec![Value::Detections(kept.into())]))
    }
}
