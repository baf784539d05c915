//! One run: source -> executor -> sinks, and the shutdown order (see the module above).
//!
//! Threads here: the caller's thread starts everything, then waits for stop requests, reloads
//! and the executor (see [`super::supervise`]), which coordinates on a `vidflow-executor`
//! thread of its own so that the caller can give up on it at the stop deadline (see
//! [`super::shutdown`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::counts::LastCounts;
use super::live::Phase;
use super::shutdown::{Delivered, StopDeadline, close_in_order, close_sinks, stop_sources};
use super::supervise::{
    Channels, FromExecutor, OpenSink, RunParts, RunningSource, Segment, Supervisor, Waited,
    add_source_stats, executor_thread,
};
use super::taps::Taps;
use super::{DaemonError, Failure, PoolReport, Report, RunOptions, Shutdown, notify};
use crate::config::Pipeline;
use crate::events::EventStore;
use crate::sinks::SinkRunner;
use crate::source;
use crate::storage::{Storage, SystemClock};
use crate::workflow::{Executor, Graph, Pool, PoolError};

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
    let started = Instant::now();
    let pipeline = without_unread_steps(pipeline);
    let Pipeline {
        path,
        sources,
        executor: executor_config,
        daemon: daemon_config,
        steps,
        sinks: sink_configs,
        http: http_config,
        storage: storage_config,
        events: events_config,
        written,
        notes: _,
    } = pipeline;
    // Bound before anything starts: a port in use fails the run at once.
    let http = match http_config.as_ref().map(super::http::bind).transpose() {
        Ok(http) => http,
        Err(e) => return Err(Failure::before_start(e.into())),
    };
    let stop_timeout = daemon_config.stop_timeout;
    let live = options.live.clone();
    live.set_phase(Phase::Starting);
    let graph = Arc::new(Graph::new(steps));
    let last_counts = Arc::new(LastCounts::new(&graph));
    let opencv_threads = i32::try_from(executor_config.opencv_threads).unwrap_or(1);
    if let Err(e) = opencv::core::set_num_threads(opencv_threads) {
        tracing::warn!(error = %e, "cannot limit OpenCV's threads");
    }

    // Stopped after the sinks are closed: they index their last files as they finish them.
    let storage = match Storage::start(storage_config, Arc::new(SystemClock)) {
        Ok(storage) => storage,
        Err(e) => {
            return Err(Failure::before_start(DaemonError::Sink {
                name: "storage".to_owned(),
                source: crate::sinks::SinkError::Other(format!("cannot start its thread: {e}")),
            }));
        }
    };
    let _stop_storage = storage.stop_on_drop();
    // Stopped after the sinks are closed: its last pass names the clips they finished last.
    let events = match events_config.map(|c| EventStore::start(&c, storage.clone())) {
        None => None,
        Some(Ok(store)) => Some(store),
        Some(Err(e)) => {
            return Err(Failure::before_start(DaemonError::Sink {
                name: "events".to_owned(),
                source: crate::sinks::SinkError::Other(format!("cannot start its thread: {e}")),
            }));
        }
    };
    let _stop_events = StopEvents(events.clone());
    let mut sinks: Vec<OpenSink> = Vec::new();
    for config in sink_configs {
        let opened = config
            .factory
            .open(&config.name, &config.inputs, &storage)
            .and_then(|sink| SinkRunner::spawn(&config.name, sink, config.routing.clone()));
        match opened {
            Ok(runner) => sinks.push(OpenSink {
                runner,
                inputs: config.inputs,
            }),
            Err(source) => {
                close_sinks(sinks.into_iter().map(|s| s.runner).collect(), None);
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
                close_sinks(sinks.into_iter().map(|s| s.runner).collect(), None);
                return Err(Failure::before_start(e.into()));
            }
        }
    };

    // Each source has its own queue, so that one cannot crowd out another.
    let mut running: Vec<RunningSource> = Vec::new();
    let mut queues = Vec::new();
    for config in sources {
        let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
        match source::start(&config, tx, &rx, options.max_frames) {
            Ok(handle) => {
                running.push(RunningSource {
                    handle,
                    config,
                    ended: false,
                });
                queues.push(rx);
            }
            Err(e) => {
                let deadline = StopDeadline::starting_now(stop_timeout);
                let handles = running.into_iter().map(|s| s.handle).collect();
                stop_sources(handles, queues, deadline.joins());
                let runners = sinks.into_iter().map(|s| s.runner).collect();
                let _ = close_in_order(host_pool, runners, &deadline);
                return Err(Failure::before_start(e.into()));
            }
        }
    }
    let executor = match &host_pool {
        Some(pool) => Executor::new(graph.clone(), pool.handle(), executor_config),
        None => Executor::owning(graph.clone(), executor_config),
    };
    let host_metrics = host_pool.as_ref().map(|p| p.metrics().clone());
    let delivered = Arc::new(Delivered::default());
    let (pause_tx, pause_rx) = crossbeam_channel::unbounded::<()>();
    let (from_tx, from_rx) = crossbeam_channel::unbounded::<FromExecutor>();
    let (to_tx, to_rx) = crossbeam_channel::bounded::<Segment>(1);
    let handing_over = Arc::new(AtomicBool::new(false));
    let taps = Arc::new(Taps::new(&graph, events, live.clone()));
    let first = Segment {
        queues: queues.clone(),
        sinks: sinks.iter().map(|s| s.runner.sender()).collect(),
        last_counts: last_counts.clone(),
        taps: taps.clone(),
        pause: pause_rx,
        executor,
    };
    let executor_metrics = first.executor.metrics().clone();
    let mut sup = Supervisor::new(
        RunParts {
            path,
            live: live.clone(),
            stop_timeout,
            max_frames: options.max_frames,
            sources: running,
            queues,
            sinks,
            storage: storage.clone(),
            graph,
            written,
            executor_config,
            http: http_config.map(|h| h.listen),
            last_counts,
            taps,
            pool: host_pool.as_ref().map(Pool::handle),
            executor_metrics,
        },
        Channels {
            requests: shutdown.rx.clone(),
            reloads: shutdown.reload_rx.clone(),
            from_executor: from_rx,
            to_executor: to_tx,
            handing_over: handing_over.clone(),
            pause: pause_tx,
        },
    );
    sup.publish();
    live.set_phase(Phase::Running);
    sup.notifier = notify::Notifier::start(&options.notify, live.clone());
    // Serves until the end of this function (dropped last: it still answers while draining).
    let _http = http.map(|bound| bound.serve(live.clone())).transpose().unwrap_or_else(|e| {
        tracing::error!(error = %e, "http endpoint: cannot start its thread; running without it");
        None
    });
    let spawned = {
        let delivered = delivered.clone();
        let live = live.clone();
        std::thread::Builder::new()
            .name("vidflow-executor".to_owned())
            .spawn(move || {
                executor_thread(first, &to_rx, &handing_over, &from_tx, &delivered, &live);
            })
    };
    let executor_thread = match spawned {
        Ok(thread) => thread,
        Err(e) => {
            let deadline = StopDeadline::starting_now(stop_timeout);
            let handles = sup.parts.sources.drain(..).map(|s| s.handle).collect();
            stop_sources(
                handles,
                std::mem::take(&mut sup.parts.queues),
                deadline.joins(),
            );
            let runners = sup.parts.sinks.drain(..).map(|s| s.runner).collect();
            let _ = close_in_order(host_pool, runners, &deadline);
            return Err(Failure::before_start(DaemonError::Pool(PoolError::Spawn(
                e,
            ))));
        }
    };

    // Wait for the executor, taking stop requests (the first stops the sources gracefully and
    // starts the stop deadline, the second aborts) and reloads.
    let Waited {
        finished,
        deadline,
        aborted,
    } = sup.wait();
    let stop_timeout = sup.parts.stop_timeout;
    // What was left unfinished: lost to the stop deadline (an error), or given up at a second
    // stop request (`cut_short`: counted and logged, not an error).
    let mut abandoned = Vec::new();
    let mut cut_short = Vec::new();
    if finished.is_some() {
        // It has sent its last message: the join is immediate.
        let _ = executor_thread.join();
    } else {
        // The drain did not end in time: stop admitting and delivering; what is queued or in
        // flight is counted below as dropped, and the executor's thread is abandoned.
        if !aborted {
            tracing::error!(
                "frames still in the workflow at the stop deadline; abandoning the drain"
            );
        }
        sup.abort();
        let what = "the workflow's drain".to_owned();
        if aborted {
            cut_short.push(what);
        } else {
            abandoned.push(what);
        }
    }
    let counts = delivered.close();

    // 1. The sources: stopped hard if still running (abort, or stop on step error), with those
    // a reload stopped that have not ended yet.
    let mut handles: Vec<_> = sup.parts.sources.drain(..).map(|s| s.handle).collect();
    handles.extend(sup.take_retired());
    let mut stopped = stop_sources(
        handles,
        std::mem::take(&mut sup.parts.queues),
        deadline.joins(),
    );
    abandoned.extend(stopped.abandoned.iter().cloned());
    for (name, stats) in std::mem::take(&mut sup.retired_stats) {
        add_source_stats(stopped.stats.entry(name).or_default(), &stats);
    }
    stopped.errors.append(&mut sup.retired_errors);
    // 2. Drained already, or abandoned above.
    let pool_metrics = host_metrics.or_else(|| {
        finished
            .as_ref()
            .and_then(|(_, executor)| executor.pool_metrics())
    });
    let coordinator_wakeups = sup.retired_metrics.0
        + finished.as_ref().map_or(0, |(_, executor)| {
            executor
                .metrics()
                .coordinator_wakeups
                .load(Ordering::Relaxed)
        });
    // Pools really started for this run: the daemon's (if `Pool::new` gave one) and any the
    // executor built for itself (it counts its own).
    let pools_built = u64::from(host_pool.is_some())
        + finished.as_ref().map_or(0, |(_, executor)| {
            executor.metrics().pools_built.load(Ordering::Relaxed)
        });
    // Panics caught on the pool's threads outside any step, and in or around steps (those the
    // executor catches, wherever the step ran).
    let panics = pool_metrics
        .as_ref()
        .map_or(0, |m| m.panics.load(Ordering::Relaxed))
        + sup.retired_metrics.1
        + finished.as_ref().map_or(0, |(_, executor)| {
            executor.metrics().step_panics.load(Ordering::Relaxed)
        });
    // 3. The pool, then 4. the sinks, whatever happened before.
    let (stats, own_pool) = match finished {
        Some((stats, executor)) => (Some(stats), executor.close()),
        None => (None, Ok(())),
    };
    let runners = sup.parts.sinks.drain(..).map(|s| s.runner).collect();
    let (host_result, mut sink_results) = close_in_order(host_pool, runners, &deadline);
    sink_results.append(&mut sup.closed_sinks);
    let pool_result = own_pool.and(host_result);
    if let Err(PoolError::Abandoned(n)) = &pool_result {
        let what = format!("{n} pool worker(s) busy in a step");
        if aborted {
            cut_short.push(what);
        } else {
            abandoned.push(what);
        }
    }

    // Every decoded frame is processed, failed or dropped: what the sources dropped and the
    // frames left in their queues are known; the rest were in the workflow when it was given
    // up (`lost`). A source abandoned while still running may count a frame between its two
    // counters: `frames_decoded` is then the sum, so the invariant holds whatever.
    let source_dropped: u64 = stopped.stats.values().map(|s| s.dropped).sum();
    let decoded: u64 = stopped.stats.values().map(|s| s.decoded).sum();
    let lost = decoded
        .saturating_sub(source_dropped + stopped.leftover + counts.processed + counts.failed);
    if lost > 0 && aborted {
        cut_short.push(format!("{lost} frame(s) in flight, counted as dropped"));
    } else if lost > 0 {
        tracing::error!(
            frames = lost,
            "frames abandoned at the stop deadline, counted as dropped"
        );
        abandoned.push(format!("{lost} frame(s)"));
    }
    let wall = started.elapsed().as_secs_f64();
    let mut report = Report {
        frames_decoded: decoded
            .max(source_dropped + stopped.leftover + counts.processed + counts.failed),
        frames_processed: counts.processed,
        frames_failed: counts.failed,
        frames_dropped: source_dropped + stopped.leftover + lost,
        sources: stopped.stats,
        record_streams: stopped.record,
        sinks: BTreeMap::new(),
        wall_seconds: wall,
        frames_per_second: if wall > 0.0 {
            (counts.processed + counts.failed) as f64 / wall
        } else {
            0.0
        },
        pool: PoolReport {
            workers: executor_config.workers,
            pools_built,
            dispatches: pool_metrics
                .as_ref()
                .map_or(0, |m| m.dispatches.load(Ordering::Relaxed)),
            wakeups: pool_metrics
                .as_ref()
                .map_or(0, |m| m.wakeups.load(Ordering::Relaxed)),
            coordinator_wakeups,
            panics,
        },
        counts: sup.parts.last_counts.take(),
        storage: sup.parts.storage.report(),
    };
    let mut errors: Vec<DaemonError> = stopped
        .errors
        .into_iter()
        .map(DaemonError::Source)
        .collect();
    if let Some(failure) = stats.and_then(|s| s.stopped_by) {
        errors.push(DaemonError::StepStop(failure));
    }
    match pool_result {
        Ok(()) | Err(PoolError::Abandoned(_)) => {}
        Err(e) => errors.push(DaemonError::Pool(e)),
    }
    for (name, stats, result) in sink_results {
        // A sink closed at a reload and opened again under its name is counted once, whole.
        let total = report.sinks.entry(name.clone()).or_default();
        total.written += stats.written;
        total.skipped += stats.skipped;
        total.dropped += stats.dropped;
        match result {
            Some(Ok(())) => {}
            Some(Err(source)) => errors.push(DaemonError::Sink {
                name: name.clone(),
                source,
            }),
            None => abandoned.push(format!("sink \"{name}\"")),
        }
        // A sink that failed or overflowed lost frames: not a clean end either.
        if stats.dropped > 0 {
            tracing::error!(sink = %name, frames = stats.dropped, "sink lost frames");
            errors.push(DaemonError::SinkLost {
                name,
                frames: stats.dropped,
            });
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
    for line in super::count_lines(&report.counts) {
        tracing::info!("final counts: {line}");
    }
    if !cut_short.is_empty() {
        tracing::warn!(
            left = %cut_short.join(", "),
            "stopped at once on a second stop request"
        );
    }
    if !abandoned.is_empty() {
        let what = abandoned.join(", ");
        tracing::error!(abandoned = %what, "stop deadline reached");
        errors.push(DaemonError::StopDeadline {
            timeout_s: stop_timeout.as_secs(),
            abandoned: what,
        });
    }
    std::mem::take(&mut sup.notifier).stop();
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(Failure {
            report: Some(Box::new(report)),
            errors,
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
