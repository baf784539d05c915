//! References: how a step or sink input names the value it reads.

/// Where a step or sink input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ref {
    /// `$frame`: the decoded frame.
    Frame,
    /// `$steps.NAME.OUTPUT`: output `output` of step `step` (an index into the pipeline's
    /// steps, in the order they run).
    Step { step: usize, output: usize },
}

/// One reference a sink reads, with the text the user wrote (without `$`), used as its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkInput {
    pub port: &'static str,
    pub label: String,
    pub from: Ref,
}
