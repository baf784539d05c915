//! One run: source -> executor -> sinks, and the shutdown order (see the module above).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{DaemonError, FRAME_QUEUE, Failure, PoolReport, Report, RunOptions, Shutdown, notify};
use crate::config::Pipeline;
use crate::sinks::{SinkError, SinkRunner, SinkStats};
use crate::source;
use crate::workflow::{Executor, Graph, Pool, PoolError};

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

    let Some(source_config) = sources.first() else {
        close_sinks(sinks);
        return Err(Failure::before_start(DaemonError::Sink {
            name: String::new(),
            source: SinkError::Other("pipeline has no source".to_owned()),
        }));
    };
    // A still image is a one-shot run: its executor builds a pool only if a step is
    // dispatched. Streams get the daemon's pool, built now, before the first frame.
    let host_pool = if source_config.uri.is_still_image() {
        None
    } else {
        match Pool::new(executor_config.workers) {
            Ok(pool) => Some(pool),
            Err(e) => {
                close_sinks(sinks);
                return Err(Failure::before_start(e.into()));
            }
        }
    };

    let (frames_tx, frames_rx) = crossbeam_channel::bounded(FRAME_QUEUE);
    let source = match source::start(source_config, frames_tx, options.max_frames) {
        Ok(source) => source,
        Err(e) => {
            let _ = close_in_order(|| host_pool.map_or(Ok(()), Pool::shutdown), sinks);
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

    let executor = match &host_pool {
        Some(pool) => Executor::new(graph, pool.handle(), executor_config),
        None => Executor::owning(graph, executor_config),
    };
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
    let metrics = executor.pool_metrics();
    let coordinator_wakeups = executor
        .metrics()
        .coordinator_wakeups
        .load(Ordering::Relaxed);
    let pools_built = match &host_pool {
        Some(_) => 1,
        None => executor.metrics().pools_built.load(Ordering::Relaxed),
    };
    // 3. The pool, then 4. the sinks, whatever happened before.
    let (pool_result, sink_results) = close_in_order(
        || {
            let own = executor.close();
            let host = host_pool.map_or(Ok(()), Pool::shutdown);
            own.and(host)
        },
        sinks,
    );

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
            workers: executor_config.workers,
            pools_built,
            dispatches: metrics
                .as_ref()
                .map_or(0, |m| m.dispatches.load(Ordering::Relaxed)),
            wakeups: metrics
                .as_ref()
                .map_or(0, |m| m.wakeups.load(Ordering::Relaxed)),
            coordinator_wakeups,
            panics: metrics
                .as_ref()
                .map_or(0, |m| m.panics.load(Ordering::Relaxed)),
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

/// Shuts the pool down (joining its threads), then closes every sink, even if the pool
/// reported a failure: the last two steps of the shutdown order.
pub fn close_in_order(
    shutdown_pool: impl FnOnce() -> Result<(), PoolError>,
    sinks: Vec<SinkRunner>,
) -> (Result<(), PoolError>, Vec<SinkClosed>) {
    let pool = shutdown_pool();
    if let Err(e) = &pool {
        tracing::error!(error = %e, "worker pool did not shut down cleanly; closing sinks anyway");
    }
    (pool, close_sinks(sinks))
}

/// A closed sink: its name, its counts, and how closing went.
pub type SinkClosed = (String, SinkStats, Result<(), SinkError>);

fn close_sinks(sinks: Vec<SinkRunner>) -> Vec<SinkClosed> {
    sinks
        .into_iter()
        .map(|s| {
            let name = s.name().to_owned();
            let (stats, result) = s.close();
            (name, stats, result)
        })
        .collect()
}
