//! One run: source -> executor -> sinks, and the shutdown order (see the module above).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::{DaemonError, Failure, PoolReport, Report, RunOptions, Shutdown, notify};
use crate::config::Pipeline;
use crate::frame::Frame;
use crate::sinks::{SinkError, SinkRunner, SinkStats};
use crate::source::{self, SourceError, SourceHandle, SourceStats};
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
    let opencv_threads = i32::try_from(executor_config.opencv_threads).unwrap_or(1);
    if let Err(e) = opencv::core::set_num_threads(opencv_threads) {
        tracing::warn!(error = %e, "cannot limit OpenCV's threads");
    }

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

    // A still image is a one-shot run: its executor builds a pool only if a step is
    // dispatched. Streams get the daemon's pool, built now, before the first frame.
    let one_shot = sources.iter().all(|s| s.uri.is_still_image());
    let host_pool = if one_shot {
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

    // Each source has its own queue, so that one cannot crowd out another.
    let mut running = Vec::new();
    let mut queues = Vec::new();
    for config in &sources {
        let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
        match source::start(config, tx, &rx, options.max_frames) {
            Ok(source) => {
                running.push(source);
                queues.push(rx);
            }
            Err(e) => {
                stop_sources(running, queues);
                let _ = close_in_order(|| host_pool.map_or(Ok(()), Pool::shutdown), sinks);
                return Err(Failure::before_start(e.into()));
            }
        }
    }
    notify::notify("READY=1");

    // Stop requests: the first stops the source gracefully, the second aborts.
    let (abort_tx, abort_rx) = crossbeam_channel::unbounded::<()>();
    let (finished_tx, finished_rx) = crossbeam_channel::bounded::<()>(0);
    let watcher = {
        let requests = shutdown.rx.clone();
        let controls: Vec<_> = running.iter().map(source::SourceHandle::control).collect();
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
                                controls.iter().for_each(source::SourceControl::stop);
                            } else {
                                tracing::warn!("second stop request: aborting");
                                controls.iter().for_each(source::SourceControl::abort);
                                let _ = abort_tx.send(());
                            }
                        }
                        recv(finished_rx) -> _ => return,
                    }
                }
            })
            .ok()
    };

    let mut executor = match &host_pool {
        Some(pool) => Executor::new(graph, pool.handle(), executor_config),
        None => Executor::owning(graph, executor_config),
    };
    let stats = executor.run_sources(&queues, &abort_rx, |result| {
        for sink in &sinks {
            sink.send(result.clone());
        }
    });

    // 1. The sources: stopped hard if still running (abort, or stop on step error).
    let (source_stats, leftover, source_errors) = stop_sources(running, queues);
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
    // Pools that were really started for this run: the daemon's (if `Pool::new` gave one)
    // and any the executor built for itself (it counts its own).
    let pools_built =
        u64::from(host_pool.is_some()) + executor.metrics().pools_built.load(Ordering::Relaxed);
    // Panics caught on the pool's threads outside any step, and in or around steps (those the
    // executor catches, wherever the step ran).
    let panics = metrics
        .as_ref()
        .map_or(0, |m| m.panics.load(Ordering::Relaxed))
        + executor.metrics().step_panics.load(Ordering::Relaxed);
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
    let mut report = Report {
        frames_decoded: source_stats.values().map(|s| s.decoded).sum(),
        frames_processed: stats.processed,
        frames_failed: stats.failed,
        frames_dropped: source_stats.values().map(|s| s.dropped).sum::<u64>() + leftover,
        sources: source_stats,
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
            panics,
        },
    };
    let mut errors: Vec<DaemonError> = source_errors.into_iter().map(DaemonError::Source).collect();
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

/// Stops every source hard and waits for it. Frames still queued are counted until a
/// source is down and its sender gone (draining also unblocks a streaming thread waiting for
/// room, so the source can stop). Returns each source's counts, the frames left in the queues
/// and the errors the sources ended with.
fn stop_sources(
    running: Vec<SourceHandle>,
    queues: Vec<Receiver<Frame>>,
) -> (BTreeMap<String, SourceStats>, u64, Vec<SourceError>) {
    for source in &running {
        source.control().abort();
    }
    let leftover = queues.iter().map(|q| q.iter().count() as u64).sum();
    drop(queues);
    let mut stats = BTreeMap::new();
    let mut errors = Vec::new();
    for source in running {
        let name = source.name().to_string();
        let counters = source.counters().clone();
        if let Err(e) = source.join() {
            errors.push(e);
        }
        stats.insert(name, counters.snapshot());
    }
    (stats, leftover, errors)
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
