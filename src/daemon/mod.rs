//! Assembles source -> executor -> sinks for one run, and takes it down in order.
//!
//! Threads: the caller's thread coordinates the executor; the source has its bus thread (and
//! GStreamer's streaming threads), the pool its workers, each sink its own thread, and a
//! `vidflow-shutdown` thread waits for stop requests.
//!
//! Shutdown order, whatever ends the run (end of stream, a stop request, a source error, a
//! step error with `on_step_error = "stop"`):
//! 1. the source is stopped (EOS; it still delivers what it decoded),
//! 2. every admitted frame is drained through the workflow and delivered to the sinks,
//! 3. the pool is shut down and its threads joined,
//! 4. the sinks are closed (files finalized), even if an earlier stage failed.
//!
//! A second stop request aborts: no new frame is admitted, frames still queued are counted as
//! dropped, frames in flight still finish, and the sinks are still closed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;

use crate::config::Pipeline;
use crate::sinks::{SinkError, SinkRunner, SinkStats};
use crate::source::{self, SourceError};
use crate::workflow::{Executor, Graph, Pool, PoolError, StepFailure};

pub mod notify;

/// Decoded frames waiting for the workflow: small, so a live source stays current and a file
/// source is paced by the workflow.
pub const FRAME_QUEUE: usize = 4;

/// Run-time choices that are not part of the pipeline file.
#[derive(Debug, Default, Clone)]
pub struct RunOptions {
    /// Stop cleanly after this many frames.
    pub max_frames: Option<u64>,
}

/// Asks a running pipeline to stop: the first request drains, the second aborts.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: Sender<()>,
    rx: Receiver<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Self { tx, rx }
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Safe to call from a signal handler thread.
    pub fn request(&self) {
        let _ = self.tx.send(());
    }
}

/// What a run did. Invariant: `frames_decoded == frames_processed + frames_failed +
/// frames_dropped`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub frames_decoded: u64,
    pub frames_processed: u64,
    pub frames_failed: u64,
    pub frames_dropped: u64,
    pub sinks: BTreeMap<String, SinkStats>,
    pub wall_seconds: f64,
    pub frames_per_second: f64,
    pub pool: PoolReport,
}

/// Pool activity: each dispatch queues one step; a wake-up is a worker leaving an idle wait.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolReport {
    pub workers: usize,
    pub dispatches: u64,
    pub wakeups: u64,
    pub panics: u64,
}

/// Why a run failed; each maps to a sysexits code.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("sink \"{name}\": {source}")]
    Sink { name: String, source: SinkError },
    #[error("worker pool: {0}")]
    Pool(#[from] PoolError),
    #[error("step \"{}\" failed and on_step_error = \"stop\": {}", .0.step, .0.message)]
    StepStop(StepFailure),
}

impl DaemonError {
    /// sysexits: 69 unavailable source, 73 cannot create output, 70 internal error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Source(_) => 69,
            Self::Sink {
                source: SinkError::Io { .. },
                ..
            } => 73,
            Self::Sink { .. } | Self::Pool(_) | Self::StepStop(_) => 70,
        }
    }
}

/// A failed run, with the report of what happened before it failed (if it started).
#[derive(Debug)]
pub struct Failure {
    pub report: Option<Box<Report>>,
    pub errors: Vec<DaemonError>,
}

impl Failure {
    fn before_start(error: DaemonError) -> Self {
        Self {
            report: None,
            errors: vec![error],
        }
    }

    /// The exit code of the first error.
    pub fn exit_code(&self) -> u8 {
        self.errors.first().map_or(70, DaemonError::exit_code)
    }
}

/// Runs a pipeline until its source ends or `shutdown` is requested.
pub fn run(
    pipeline: Pipeline,
    options: &RunOptions,
    shutdown: &Shutdown,
) -> Result<Report, Failure> {
    let started = Instant::now();
    let Pipeline {
        sources,
        executor: executor_config,
        steps,
        sinks: sink_configs,
        ..
    } = pipeline;
    let graph = Arc::new(Graph::new(steps));

    let mut sinks = Vec::new();
    for config in &sink_configs {
        let opened = config
            .factory
            .open(&config.name, &config.inputs)
            .and_then(|sink| SinkRunner::spawn(&config.name, sink));
        match opened {
            Ok(runner) => sinks.push(runner),
            Err(source) => {
                close_sinks(sinks);
                return Err(Failure::before_start(DaemonError::Sink {
                    name: config.name.to_string(),
                    source,
                }));
            }
        }
    }

    let pool = match Pool::new(executor_config.workers) {
        Ok(pool) => pool,
        Err(e) => {
            close_sinks(sinks);
            return Err(Failure::before_start(e.into()));
        }
    };

    let (frames_tx, frames_rx) = crossbeam_channel::bounded(FRAME_QUEUE);
    let Some(source_config) = sources.first() else {
        close_sinks(sinks);
        let _ = pool.shutdown();
        return Err(Failure::before_start(DaemonError::Sink {
            name: String::new(),
            source: SinkError::Other("pipeline has no source".to_owned()),
        }));
    };
    let source = match source::start(source_config, frames_tx, options.max_frames) {
        Ok(source) => source,
        Err(e) => {
            let _ = pool.shutdown();
            close_sinks(sinks);
            return Err(Failure::before_start(e.into()));
        }
    };
    notify::notify("READY=1");

    // Stop requests: the first stops the source gracefully, the second aborts.
    let (abort_tx, abort_rx) = crossbeam_channel::unbounded::<()>();
    let (finished_tx, finished_rx) = crossbeam_channel::bounded::<()>(0);
    let watcher = {
        let requests = shutdown.rx.clone();
        let control = source.control();
        std::thread::Builder::new()
            .name("vidflow-shutdown".to_owned())
            .spawn(move || {
                let mut count = 0;
                loop {
                    crossbeam_channel::select! {
                        recv(requests) -> r => {
                            if r.is_err() { return; }
                            count += 1;
                            if count == 1 {
                                tracing::info!("stop requested: draining (send again to stop at once)");
                                notify::notify("STOPPING=1");
                                control.stop();
                            } else {
                                tracing::warn!("second stop request: aborting");
                                control.abort();
                                let _ = abort_tx.send(());
                            }
                        }
                        recv(finished_rx) -> _ => return,
                    }
                }
            })
            .ok()
    };

    let executor = Executor::new(graph, pool.handle(), executor_config);
    let stats = executor.run(&frames_rx, &abort_rx, |result| {
        for sink in &sinks {
            sink.send(result.clone());
        }
    });

    // 1. The source: stopped hard if it is still running (abort, or stop on step error).
    // Frames still queued are counted until the source is down and its sender gone (draining
    // also unblocks a streaming thread waiting for room, so the source can stop).
    source.control().abort();
    let leftover = frames_rx.iter().count() as u64;
    drop(frames_rx);
    let counters = source.counters().clone();
    let source_result = source.join();
    drop(finished_tx);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    // 2. Drained already: `run` returns after the last admitted frame was delivered.
    drop(executor);
    // 3. The pool.
    let metrics = pool.metrics().clone();
    let workers = pool.size();
    let pool_result = pool.shutdown();
    // 4. The sinks, whatever happened before.
    let sink_results = close_sinks(sinks);

    let wall = started.elapsed().as_secs_f64();
    let decoded = counters.decoded.load(Ordering::Relaxed);
    let mut report = Report {
        frames_decoded: decoded,
        frames_processed: stats.processed,
        frames_failed: stats.failed,
        frames_dropped: counters.dropped.load(Ordering::Relaxed) + leftover,
        sinks: BTreeMap::new(),
        wall_seconds: wall,
        frames_per_second: if wall > 0.0 {
            (stats.processed + stats.failed) as f64 / wall
        } else {
            0.0
        },
        pool: PoolReport {
            workers,
            dispatches: metrics.dispatches.load(Ordering::Relaxed),
            wakeups: metrics.wakeups.load(Ordering::Relaxed),
            panics: metrics.panics.load(Ordering::Relaxed),
        },
    };
    let mut errors = Vec::new();
    if let Err(e) = source_result {
        errors.push(DaemonError::Source(e));
    }
    if let Some(failure) = stats.stopped_by {
        errors.push(DaemonError::StepStop(failure));
    }
    if let Err(e) = pool_result {
        errors.push(DaemonError::Pool(e));
    }
    for (name, stats, result) in sink_results {
        report.sinks.insert(name.clone(), stats);
        if let Err(source) = result {
            errors.push(DaemonError::Sink { name, source });
        }
    }
    tracing::info!(
        decoded = report.frames_decoded,
        processed = report.frames_processed,
        failed = report.frames_failed,
        dropped = report.frames_dropped,
        fps = format!("{:.1}", report.frames_per_second),
        "pipeline finished"
    );
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(Failure {
            report: Some(Box::new(report)),
            errors,
        })
    }
}

fn close_sinks(sinks: Vec<SinkRunner>) -> Vec<(String, SinkStats, Result<(), SinkError>)> {
    sinks
        .into_iter()
        .map(|s| {
            let name = s.name().to_owned();
            let (stats, result) = s.close();
            (name, stats, result)
        })
        .collect()
}
