//! The last `counts` value of every step that outputs counts, per source: what a run reports
//! at its end (`street: line in=12 out=9`) and writes in the stats JSON.
//!
//! Written by the executor's delivery callback (on the `vidflow-executor` thread), one frame
//! result at a time, in each source's frame order; read once by the run's thread after the
//! executor has finished. The mutex is never contended in practice.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::outcome::FrameResult;
use crate::spec::Ref;
use crate::value::{Counts, Value, ValueType};
use crate::workflow::Graph;

/// Source name -> step name (with `.OUTPUT` when the step has several counts outputs) -> last
/// counts seen.
pub type FinalCounts = BTreeMap<String, BTreeMap<String, Counts>>;

#[derive(Debug)]
pub(super) struct LastCounts {
    /// Every counts output of the graph, with the name it is reported under.
    outputs: Vec<(String, Ref)>,
    seen: Mutex<FinalCounts>,
}

impl LastCounts {
    pub(super) fn new(graph: &Graph) -> Self {
        let mut outputs = Vec::new();
        for (step, node) in graph.nodes.iter().enumerate() {
            let ports: Vec<_> = node
                .kind
                .outputs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.ty == ValueType::Counts)
                .collect();
            for &(output, port) in &ports {
                let name = if ports.len() == 1 {
                    node.name.to_string()
                } else {
                    format!("{}.{}", node.name, port.name)
                };
                outputs.push((name, Ref::Step { step, output }));
            }
        }
        Self {
            outputs,
            seen: Mutex::new(BTreeMap::new()),
        }
    }

    /// Keeps the counts of this frame (a step skipped on it keeps its earlier value).
    pub(super) fn record(&self, result: &FrameResult) {
        if self.outputs.is_empty() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let source = &result.frame().source;
        for (name, r) in &self.outputs {
            if let Some(Value::Counts(counts)) = result.value(*r) {
                let steps = match seen.get_mut(&**source) {
                    Some(steps) => steps,
                    None => seen.entry(source.to_string()).or_default(),
                };
                steps.insert(name.clone(), Counts::clone(&counts));
            }
        }
    }

    /// The same for `graph`, a reload's, carrying over what was seen so far: counts of a step
    /// the reload kept go on from their last value.
    pub(super) fn carried_to(&self, graph: &Graph) -> Self {
        let next = Self::new(graph);
        *next.seen.lock().unwrap_or_else(PoisonError::into_inner) = self.take();
        next
    }

    pub(super) fn take(&self) -> FinalCounts {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One line per source and step: `street: line in=12 out=9`.
pub fn lines(counts: &FinalCounts) -> Vec<String> {
    let mut out = Vec::new();
    for (source, steps) in counts {
        for (step, c) in steps {
            let values: Vec<_> = c.0.iter().map(|(k, n)| format!("{k}={n}")).collect();
            out.push(format!("{source}: {step} {}", values.join(" ")));
        }
    }
    out
}
