//! Step kinds for steps built in code (tests and benchmarks), by the shape of their inputs.
//! Their builder is never called: such steps are not read from pipeline files.

use vidflow::spec::{Diagnostic, Params};
use vidflow::steps::{Port, Step, StepKind};
use vidflow::value::ValueType;

fn no_build(_: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    Err(Diagnostic::new("built in code only"))
}

const DET: Port = Port {
    name: "in",
    ty: ValueType::Detections,
    optional: false,
};
const OUT: &[Port] = &[Port {
    name: "out",
    ty: ValueType::Detections,
    optional: false,
}];

pub static FROM_FRAME: StepKind = StepKind {
    name: "code-root",
    summary: "",
    inputs: &[Port {
        name: "image",
        ty: ValueType::Image,
        optional: false,
    }],
    outputs: OUT,
    params: &[],
    stateful: false,
    build: no_build,
};
pub static ONE: StepKind = StepKind {
    name: "code-1",
    summary: "",
    inputs: &[DET],
    outputs: OUT,
    params: &[],
    stateful: false,
    build: no_build,
};
pub static TWO: StepKind = StepKind {
    name: "code-2",
    summary: "",
    inputs: &[DET, DET],
    outputs: OUT,
    params: &[],
    stateful: false,
    build: no_build,
};
pub static STATEFUL: StepKind = StepKind {
    name: "code-stateful",
    summary: "",
    inputs: &[DET],
    outputs: OUT,
    params: &[],
    stateful: true,
    build: no_build,
};
pub static OPTIONAL: StepKind = StepKind {
    name: "code-optional",
    summary: "",
    inputs: &[Port {
        name: "in",
        ty: ValueType::Detections,
        optional: true,
    }],
    outputs: OUT,
    params: &[],
    stateful: false,
    build: no_build,
};
