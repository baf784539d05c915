//! Where the executor's jobs go: the host's pool, or one the executor builds for itself.
//!
//! The executor's own pool is built by the first thread that dispatches a job (a `OnceLock`,
//! so exactly once even if two workers dispatch at the same moment) and shut down once, by
//! `Executor::close` or on drop, which takes it out of its mutex and joins its workers. A host's
//! pool is only used: never built or shut down here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::super::pool::{Pool, PoolError, PoolHandle, PoolMetrics};
use super::ExecutorMetrics;

#[derive(Debug)]
pub(super) enum PoolSource {
    /// The host's pool: used, never built or shut down here.
    Host(PoolHandle),
    /// Built at the first dispatch, shut down once by `close` (or on drop).
    Own {
        size: usize,
        handle: OnceLock<Option<PoolHandle>>,
        pool: Mutex<Option<Pool>>,
    },
}

impl PoolSource {
    pub(super) fn own(size: usize) -> Self {
        Self::Own {
            size,
            handle: OnceLock::new(),
            pool: Mutex::new(None),
        }
    }

    /// The pool to queue jobs on; builds the executor's own pool on first use (counted in
    /// `metrics.pools_built`). `None` only if its threads could not be started: jobs then run
    /// on the calling thread.
    pub(super) fn get(&self, metrics: &ExecutorMetrics) -> Option<&PoolHandle> {
        match self {
            Self::Host(handle) => Some(handle),
            Self::Own { size, handle, pool } => handle
                .get_or_init(|| match Pool::new(*size) {
                    Ok(built) => {
                        metrics.pools_built.fetch_add(1, Ordering::Relaxed);
                        let h = built.handle();
                        *pool.lock().unwrap_or_else(PoisonError::into_inner) = Some(built);
                        Some(h)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start worker pool; running steps inline");
                        None
                    }
                })
                .as_ref(),
        }
    }

    /// Threads of the pool in use (or that will be, for an own pool not built yet).
    pub(super) fn size(&self) -> usize {
        match self {
            Self::Host(handle) => handle.size(),
            Self::Own { size, .. } => *size,
        }
    }

    /// The counters of the pool in use: the host's, or the own pool's once built.
    pub(super) fn metrics(&self) -> Option<Arc<PoolMetrics>> {
        match self {
            Self::Host(handle) => Some(handle.metrics().clone()),
            Self::Own { handle, .. } => handle.get()?.as_ref().map(|h| h.metrics().clone()),
        }
    }

    /// Shuts the own pool down and joins it, if it was built and is still up.
    pub(super) fn shutdown_own(&self) -> Result<(), PoolError> {
        let Self::Own { pool, .. } = self else {
            return Ok(());
        };
        let taken = pool.lock().unwrap_or_else(PoisonError::into_inner).take();
        taken.map_or(Ok(()), Pool::shutdown)
    }
}
