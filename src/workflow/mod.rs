//! The workflow: the compiled DAG, the persistent worker pool and the executor.

pub mod executor;
pub mod graph;
pub mod pool;

pub use executor::{Executor, FrameResult, Outcome, RunStats, StepFailure};
pub use graph::Graph;
pub use pool::{Pool, PoolError, PoolHandle, PoolMetrics};
