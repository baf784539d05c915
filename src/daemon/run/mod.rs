//! One run: source -> executor -> sinks, and the shutdown order (see the module above).
//!
//! Threads here: the caller's thread starts everything, then waits for stop requests, reloads
//! and the executor (see [`super::supervise`]), which coordinates on a `vidflow-executor`
//! thread of its own so that the caller can give up on it at the stop deadline (see
//! [`super::shutdown`]).
//!
//! [`run`] is the order, part by part: each part is started by its owner and stopped by it.
//! The storage and the event store ([`Services`]) stop last, when [`run`] returns; the sinks,
//! the daemon's pool and the sources start in `start.rs` ([`start::Starting`], which takes down
//! what started if a later part cannot), then the executor's thread, its supervisor, notify and
//! HTTP ([`start::Running`]); `end.rs` stops them in the shutdown order and makes the report.

use std::sync::Arc;

use super::counts::LastCounts;
use super::live::Phase;
use super::{DaemonError, Failure, Report, RunOptions, Shutdown};
use crate::config::Pipeline;
use crate::events::{EventStore, EventsConfig};
use crate::storage::{StopOnDrop, Storage, StorageConfig, SystemClock};
use crate::workflow::Graph;

mod end;
mod start;

/// The pipeline as it is, its steps nothing in a run observes said in the log
/// (`config::prune`); a reload's pipeline goes through here too. They still run: a step's
/// failures, hangs and panics are the run's (counted, and on_step_error applies) whether or
/// not a sink reads it.
pub(super) fn without_unread_steps(pipeline: Pipeline) -> Pipeline {
    let unread: Vec<_> = pipeline
        .steps
        .iter()
        .zip(pipeline.needed_steps())
        .filter(|(_, needed)| !needed)
        .map(|(s, _)| s.name.clone())
        .collect();
    if !unread.is_empty() {
        tracing::info!("{}", crate::config::pruned_message(&unread));
    }
    pipeline
}

/// Runs a pipeline until its source ends or `shutdown` is requested.
pub fn run(
    pipeline: Pipeline,
    options: &RunOptions,
    shutdown: &Shutdown,
) -> Result<Report, Failure> {
    let started = std::time::Instant::now();
    let Pipeline {
        path,
        sources,
        executor,
        daemon,
        steps,
        sinks,
        http,
        storage,
        events,
        written,
        notes: _,
    } = without_unread_steps(pipeline);
    // Before anything opens a descriptor: what the HTTP endpoint sizes its caps by.
    super::fds::raise_limit();
    // Bound before anything starts: a port in use fails the run at once.
    let bound = match http.as_ref().map(super::http::bind).transpose() {
        Ok(bound) => bound.zip(http.map(|h| h.listen)),
        Err(e) => return Err(Failure::before_start(e.into())),
    };
    let live = options.live.clone();
    live.set_phase(Phase::Starting);
    let graph = Arc::new(Graph::new(steps));
    let last_counts = Arc::new(LastCounts::new(&graph));
    let opencv_threads = i32::try_from(executor.opencv_threads).unwrap_or(1);
    if let Err(e) = opencv::core::set_num_threads(opencv_threads) {
        tracing::warn!(error = %e, "cannot limit OpenCV's threads");
    }
    let events_config = events.clone();
    let services = Services::start(storage, events)?;
    let mut starting = start::Starting::new(daemon.stop_timeout);
    starting.open_sinks(sinks, &services.storage)?;
    starting.build_pool(&sources, executor.workers)?;
    starting.start_sources(sources, options.max_frames)?;
    let assembly = start::Assembly {
        path,
        live,
        graph,
        last_counts,
        written,
        executor,
        storage: services.storage.clone(),
        events: services.events.0.clone(),
        events_config,
        http: bound,
    };
    let running = starting.run(assembly, options, shutdown)?;
    // 1. stop the sources, 2. drain the workflow, 3. join the pool, 4. close the sinks; then
    // the report. The services stop when they go out of scope, after the sinks.
    running.stop().report(started)
}

/// The storage's retention and the event store: started before the sinks, which index the
/// files they write in them, and stopped after the sinks are closed (dropped in this order when
/// [`run`] returns): the event store's last pass names the clips the sinks finished last, then
/// the storage indexes their last files.
struct Services {
    events: StopEvents,
    _stop_storage: StopOnDrop,
    storage: Storage,
}

impl Services {
    fn start(storage: StorageConfig, events: Option<EventsConfig>) -> Result<Self, Failure> {
        let started = |name: &str, e: std::io::Error| {
            Failure::before_start(DaemonError::Sink {
                name: name.to_owned(),
                source: crate::sinks::SinkError::Other(format!("cannot start its thread: {e}")),
            })
        };
        let storage =
            Storage::start(storage, Arc::new(SystemClock)).map_err(|e| started("storage", e))?;
        let stop_storage = storage.stop_on_drop();
        let events = match events.map(|c| EventStore::start(&c, storage.clone())) {
            None => None,
            Some(Ok(store)) => Some(store),
            Some(Err(e)) => return Err(started("events", e)),
        };
        Ok(Self {
            events: StopEvents(events),
            _stop_storage: stop_storage,
            storage,
        })
    }
}

/// Stops the event store when the run's function returns, whichever way: after the sinks are
/// closed (their last files indexed), before the storage's own stop.
struct StopEvents(Option<EventStore>);

impl Drop for StopEvents {
    fn drop(&mut self) {
        if let Some(store) = self.0.take() {
            store.stop();
        }
    }
}
