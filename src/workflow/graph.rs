//! A checked pipeline's steps compiled into the DAG the executor walks.
//!
//! Compiled once at start-up: for every node its inputs, its distinct predecessors (how many
//! must finish before it may start) and its distinct successors (whom to tell when it
//! finishes). Nothing here changes while frames run.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::config::{Pipeline, StepConfig};
use crate::spec::Ref;
use crate::steps::{Placement, Step};
use crate::value::ValueType;

#[derive(Debug)]
pub struct Node {
    pub name: Arc<str>,
    pub kind: &'static crate::steps::StepKind,
    pub step: Arc<dyn Step>,
    /// One per input port; `None` for an optional input left out.
    pub inputs: Vec<Option<Ref>>,
    /// Runs on frames whose number is a multiple of this (`every_n_frames`, 1: every frame).
    pub every: u64,
    /// Number of distinct steps this node reads from.
    pub predecessors: usize,
    /// Distinct steps that read from this node.
    pub successors: Vec<usize>,
}

/// The compiled workflow.
#[derive(Debug)]
pub struct Graph {
    pub nodes: Vec<Node>,
    /// Nodes that read only the frame: they start as soon as a frame arrives.
    pub roots: Vec<usize>,
}

impl Graph {
    /// Compiles steps given in an order where each step comes after those it reads from.
    pub fn new(steps: Vec<StepConfig>) -> Self {
        let mut nodes: Vec<Node> = steps
            .into_iter()
            .map(|s| Node {
                name: s.name,
                kind: s.kind,
                step: s.step,
                inputs: s.inputs,
                every: s.every,
                predecessors: 0,
                successors: Vec::new(),
            })
            .collect();
        for i in 0..nodes.len() {
            let mut preds: Vec<usize> = nodes[i]
                .inputs
                .iter()
                .flatten()
                .filter_map(|r| match r {
                    Ref::Step { step, .. } => Some(*step),
                    Ref::Frame => None,
                })
                .collect();
            preds.sort_unstable();
            preds.dedup();
            nodes[i].predecessors = preds.len();
            for p in preds {
                nodes[p].successors.push(i);
            }
        }
        let roots = (0..nodes.len())
            .filter(|&i| nodes[i].predecessors == 0)
            .collect();
        Self { nodes, roots }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How the image a value was found in lies on the frame, from the frame's side: for an
    /// image, the steps that made it; for boxes, lines or counts, those that made the image
    /// their step read (its `image` input, else its first boxes input: a tracker's
    /// detections, a counter's tracks). Empty: the frame's own pixels (also when no image is
    /// found).
    pub fn placements(&self, at: Ref) -> Vec<Placement> {
        let mut chain = Vec::new();
        let mut at = at;
        // Each step reads only steps before it: the walk ends.
        while let Ref::Step { step, output } = at {
            let node = &self.nodes[step];
            let ports = node.kind.inputs.iter().zip(&node.inputs);
            let read = |wanted: &dyn Fn(ValueType) -> bool| {
                ports.clone().find_map(|(p, r)| r.filter(|_| wanted(p.ty)))
            };
            if node.kind.outputs[output].ty == ValueType::Image {
                chain.push(node.step.placement());
            }
            let next = read(&|t| t == ValueType::Image)
                .or_else(|| read(&|t| matches!(t, ValueType::Detections | ValueType::Tracks)));
            match next {
                Some(r) => at = r,
                None => return Vec::new(),
            }
        }
        chain.reverse();
        chain
    }
}

/// A quoted DOT label of several lines.
fn label(lines: &[&str]) -> String {
    let escaped: Vec<String> = lines
        .iter()
        .map(|l| l.replace('\\', "\\\\").replace('"', "\\\""))
        .collect();
    format!("\"{}\"", escaped.join("\\n"))
}

/// The workflow of a pipeline as Graphviz DOT: the frame, the steps, the sinks, and an edge per
/// reference labelled with the output it carries. A step a run leaves out (no sink reads it,
/// `config::prune`) is dashed.
pub fn dot(pipeline: &Pipeline) -> String {
    let mut out = String::from("digraph vidflow {\n  rankdir=LR;\n  node [fontname=\"sans\"];\n");
    let q = |s: &str| label(&[s]);
    for s in &pipeline.sources {
        let _ = writeln!(
            out,
            "  {} [shape=cds, label={}];",
            q(&format!("source:{}", s.name)),
            label(&[&s.name, &s.uri.to_string()])
        );
    }
    let frame = q("$frame");
    let _ = writeln!(out, "  {frame} [shape=oval, label=\"frame\"];");
    for s in &pipeline.sources {
        let _ = writeln!(out, "  {} -> {frame};", q(&format!("source:{}", s.name)));
    }
    let node = |r: &Ref| match r {
        Ref::Frame => (frame.clone(), "image".to_owned()),
        Ref::Step { step, output } => {
            let s = &pipeline.steps[*step];
            (
                q(&format!("step:{}", s.name)),
                s.kind.outputs[*output].name.to_owned(),
            )
        }
    };
    let needed = pipeline.needed_steps();
    for (s, needed) in pipeline.steps.iter().zip(needed) {
        let id = q(&format!("step:{}", s.name));
        let kind = format!("({})", s.kind.name);
        let _ = if needed {
            writeln!(
                out,
                "  {id} [shape=box, label={}];",
                label(&[&s.name, &kind])
            )
        } else {
            writeln!(
                out,
                "  {id} [shape=box, style=dashed, label={}];",
                label(&[&s.name, &kind, "not run: nothing reads it"])
            )
        };
        for (port, input) in s.kind.inputs.iter().zip(&s.inputs) {
            let Some(input) = input else { continue };
            let (from, output) = node(input);
            let _ = writeln!(
                out,
                "  {from} -> {id} [label={}];",
                q(&format!("{output} → {}", port.name))
            );
        }
    }
    for s in &pipeline.sinks {
        let id = q(&format!("sink:{}", s.name));
        let _ = writeln!(
            out,
            "  {id} [shape=folder, label={}];",
            label(&[&s.name, &format!("({})", s.kind.name)])
        );
        if s.inputs.is_empty() {
            let _ = writeln!(out, "  {frame} -> {id} [style=dashed, label=\"metadata\"];");
        }
        for input in &s.inputs {
            let (from, output) = node(&input.from);
            let _ = writeln!(out, "  {from} -> {id} [label={}];", q(&output));
        }
    }
    out.push_str("}\n");
    out
}
