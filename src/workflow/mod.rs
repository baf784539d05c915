//! The workflow: the compiled DAG, the persistent worker pool and the executor.

pub mod executor;
pub mod graph;
pub mod pool;

use std::sync::Arc;

pub use executor::{Executor, ExecutorMetrics, LATENCY_BUCKETS_S, RunStats, StepMetrics};
pub use graph::Graph;
pub use pool::{Pool, PoolError, PoolHandle, PoolMetrics};
// What a finished frame carries lives below the workflow (sinks read it); re-exported here for
// the executor's users.
pub use crate::outcome::{FrameResult, Outcome, StepFailure};

use crate::config::{ExecutorConfig, Pipeline, StepConfig};
use crate::frame::Frame;

/// A workflow for one-shot library use, without a host: it builds one pool at its first
/// dispatch, uses it for every frame it is given, and shuts it down exactly once, in
/// [`Workflow::close`] or when dropped.
#[derive(Debug)]
pub struct Workflow {
    executor: Executor,
}

impl Workflow {
    pub fn new(steps: Vec<StepConfig>, config: ExecutorConfig) -> Self {
        Self {
            executor: Executor::owning(Arc::new(Graph::new(steps)), config),
        }
    }

    /// The steps and executor settings of a loaded pipeline (its source and sinks unused).
    pub fn from_pipeline(pipeline: Pipeline) -> Self {
        Self::new(pipeline.steps, pipeline.executor)
    }

    /// Runs one frame through every step and returns its result.
    pub fn run_once(&mut self, frame: Frame) -> FrameResult {
        self.executor.process(frame)
    }

    pub fn metrics(&self) -> &ExecutorMetrics {
        self.executor.metrics()
    }

    /// Shuts the pool down (if one was built) and joins its threads.
    pub fn close(self) -> Result<(), PoolError> {
        self.executor.close()
    }
}
