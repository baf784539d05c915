//! One run: source -> executor -> sinks, and the shutdown order (see the module above).
//!
//! Threads here: the caller's thread starts everything, then waits for stop requests and for
//! the executor, which coordinates on a `vidflow-executor` thread of its own so that the caller
//! can give up on it at the stop deadline (see [`super::shutdown`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};

use super::counts::LastCounts;
use super::live::{LiveSink, LiveSource, Parts, Phase};
use super::shutdown::{Delivered, StopDeadline, close_in_order, close_sinks, stop_sources};
use super::{DaemonError, Failure, Live, PoolReport, Report, RunOptions, Shutdown, notify};
use crate::config::Pipeline;
use crate::sinks::SinkRunner;
use crate::source::{self, SourceControl, SourceHandle};
use crate::workflow::{Executor, Graph, Pool, PoolError, RunStats};

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
        daemon: daemon_config,
        steps,
        sinks: sink_configs,
        http: http_config,
        ..
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

    let mut sinks = Vec::new();
    for config in &sink_configs {
        let opened = config
            .factory
            .open(&config.name, &config.inputs)
            .and_then(|sink| SinkRunner::spawn(&config.name, sink, config.routing.clone()));
        match opened {
            Ok(runner) => sinks.push(runner),
            Err(source) => {
                close_sinks(sinks, None);
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
                close_sinks(sinks, None);
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
                let deadline = StopDeadline::starting_now(stop_timeout);
                stop_sources(running, queues, deadline.joins());
                let _ = close_in_order(host_pool, sinks, &deadline);
                return Err(Failure::before_start(e.into()));
            }
        }
    }
    let mut executor = match &host_pool {
        Some(pool) => Executor::new(graph, pool.handle(), executor_config),
        None => Executor::owning(graph, executor_config),
    };
    let host_metrics = host_pool.as_ref().map(|p| p.metrics().clone());
    live.set_parts(Parts {
        sources: running
            .iter()
            .zip(&sources)
            .map(|(handle, config)| LiveSource::of(handle, config.uri.is_live()))
            .collect(),
        sinks: sinks
            .iter()
            .map(|s| LiveSink {
                name: s.name().into(),
                sender: s.sender(),
            })
            .collect(),
        executor: Some(executor.metrics().clone()),
        pool: host_metrics.clone(),
    });
    live.set_phase(Phase::Running);
    let notifier = notify::Notifier::start(&options.notify, live.clone());
    // Serves until the end of this function (dropped last: it still answers while draining).
    let _http = http.map(|bound| bound.serve(live.clone())).transpose().unwrap_or_else(|e| {
        tracing::error!(error = %e, "http endpoint: cannot start its thread; running without it");
        None
    });
    let delivered = Arc::new(Delivered::default());
    let (abort_tx, abort_rx) = crossbeam_channel::unbounded::<()>();
    let (finished_tx, finished_rx) = crossbeam_channel::bounded::<(RunStats, Executor)>(1);
    let spawned = {
        let queues = queues.clone();
        let senders: Vec<_> = sinks.iter().map(SinkRunner::sender).collect();
        let delivered = delivered.clone();
        let last_counts = last_counts.clone();
        let live = live.clone();
        std::thread::Builder::new()
            .name("vidflow-executor".to_owned())
            .spawn(move || {
                let stats = executor.run_sources(&queues, &abort_rx, |result| {
                    if delivered.count(&result) {
                        live.count_delivered(result.failure().is_some());
                        last_counts.record(&result);
                        for sink in &senders {
                            sink.send(result.clone());
                        }
                    }
                });
                let _ = finished_tx.send((stats, executor));
            })
    };
    let executor_thread = match spawned {
        Ok(thread) => thread,
        Err(e) => {
            let deadline = StopDeadline::starting_now(stop_timeout);
            stop_sources(running, queues, deadline.joins());
            let _ = close_in_order(host_pool, sinks, &deadline);
            return Err(Failure::before_start(DaemonError::Pool(PoolError::Spawn(
                e,
            ))));
        }
    };

    // Wait for the executor, taking stop requests: the first stops the sources gracefully and
    // starts the stop deadline, the second aborts.
    let controls: Vec<_> = running.iter().map(SourceHandle::control).collect();
    let (finished, deadline) = wait(&WaitFor {
        requests: &shutdown.rx,
        finished: &finished_rx,
        sources: running.iter().map(SourceHandle::done).collect(),
        controls: &controls,
        abort: &abort_tx,
        live: &live,
        notifier: &notifier,
        stop_timeout,
    });
    let mut abandoned = Vec::new();
    if finished.is_some() {
        // It has sent its last message: the join is immediate.
        let _ = executor_thread.join();
    } else {
        // The drain did not end in time: stop admitting and delivering; what is queued or in
        // flight is counted below as dropped, and the executor's thread is abandoned.
        tracing::error!("frames still in the workflow at the stop deadline; abandoning the drain");
        controls.iter().for_each(SourceControl::abort);
        let _ = abort_tx.send(());
        abandoned.push("the workflow's drain".to_owned());
    }
    let counts = delivered.close();

    // 1. The sources: stopped hard if still running (abort, or stop on step error).
    let stopped = stop_sources(running, queues, deadline.joins());
    abandoned.extend(stopped.abandoned.iter().cloned());
    // 2. Drained already, or abandoned above.
    let pool_metrics = host_metrics.or_else(|| {
        finished
            .as_ref()
            .and_then(|(_, executor)| executor.pool_metrics())
    });
    let coordinator_wakeups = finished.as_ref().map_or(0, |(_, executor)| {
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
        + finished.as_ref().map_or(0, |(_, executor)| {
            executor.metrics().step_panics.load(Ordering::Relaxed)
        });
    // 3. The pool, then 4. the sinks, whatever happened before.
    let (stats, own_pool) = match finished {
        Some((stats, executor)) => (Some(stats), executor.close()),
        None => (None, Ok(())),
    };
    let (host_result, sink_results) = close_in_order(host_pool, sinks, &deadline);
    let pool_result = own_pool.and(host_result);
    if let Err(PoolError::Abandoned(n)) = &pool_result {
        abandoned.push(format!("{n} pool worker(s)"));
    }

    // Every decoded frame is processed, failed or dropped: what the sources dropped and the
    // frames left in their queues are known; the rest were in the workflow when it was given
    // up (`lost`). A source abandoned while still running may count a frame between its two
    // counters: `frames_decoded` is then the sum, so the invariant holds whatever.
    let source_dropped: u64 = stopped.stats.values().map(|s| s.dropped).sum();
    let decoded: u64 = stopped.stats.values().map(|s| s.decoded).sum();
    let lost = decoded
        .saturating_sub(source_dropped + stopped.leftover + counts.processed + counts.failed);
    if lost > 0 {
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
        counts: last_counts.take(),
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
        report.sinks.insert(name.clone(), stats);
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
    if !abandoned.is_empty() {
        let what = abandoned.join(", ");
        tracing::error!(abandoned = %what, "stop deadline reached");
        errors.push(DaemonError::StopDeadline {
            timeout_s: stop_timeout.as_secs(),
            abandoned: what,
        });
    }
    notifier.stop();
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(Failure {
            report: Some(Box::new(report)),
            errors,
        })
    }
}

/// What [`wait`] listens to.
struct WaitFor<'a> {
    requests: &'a Receiver<()>,
    finished: &'a Receiver<(RunStats, Executor)>,
    /// Disconnects when its source has ended (see `SourceHandle::done`).
    sources: Vec<Receiver<()>>,
    controls: &'a [SourceControl],
    abort: &'a Sender<()>,
    live: &'a Live,
    notifier: &'a notify::Notifier,
    stop_timeout: Duration,
}

/// Blocks until the executor has drained, or the drain's share of the stop deadline is over
/// (`None`). Returns the deadline of the rest of the shutdown. It starts at the first stop
/// request, or when every source has ended by itself (end of stream, error), or when the
/// executor finished (a step error with `on_step_error = "stop"`): whatever ends the run.
fn wait(w: &WaitFor<'_>) -> (Option<(RunStats, Executor)>, StopDeadline) {
    let mut requests = w.requests.clone();
    let mut sources = w.sources.clone();
    let mut count = 0;
    let mut deadline: Option<StopDeadline> = None;
    loop {
        let timer = deadline.map_or_else(crossbeam_channel::never, |d| {
            crossbeam_channel::at(d.drain())
        });
        let mut select = Select::new();
        let requests_at = select.recv(&requests);
        let finished_at = select.recv(w.finished);
        let timer_at = select.recv(&timer);
        // Each source still running; its channel disconnects when it ends.
        let first_source = timer_at + 1;
        for done in &sources {
            select.recv(done);
        }
        let op = select.select();
        match op.index() {
            i if i == requests_at => {
                if op.recv(&requests).is_err() {
                    requests = crossbeam_channel::never();
                    continue;
                }
                count += 1;
                if count == 1 {
                    tracing::info!(
                        stop_timeout_s = w.stop_timeout.as_secs(),
                        "stop requested: draining (send again to stop at once)"
                    );
                    w.notifier.stopping();
                    w.live.set_phase(Phase::Draining);
                    deadline = Some(StopDeadline::starting_now(w.stop_timeout));
                    w.controls.iter().for_each(SourceControl::stop);
                } else {
                    tracing::warn!("second stop request: aborting");
                    w.controls.iter().for_each(SourceControl::abort);
                    let _ = w.abort.send(());
                }
            }
            i if i == finished_at => {
                let r = op.recv(w.finished);
                let deadline =
                    deadline.unwrap_or_else(|| StopDeadline::starting_now(w.stop_timeout));
                // Disconnected: the executor's thread panicked; nothing is left to wait for.
                return (r.ok(), deadline);
            }
            i if i == timer_at => {
                let _ = op.recv(&timer);
                let deadline =
                    deadline.unwrap_or_else(|| StopDeadline::starting_now(w.stop_timeout));
                return (None, deadline);
            }
            i => {
                let _ = op.recv(&sources[i - first_source]);
                sources.remove(i - first_source);
                if sources.is_empty() && deadline.is_none() {
                    w.live.set_phase(Phase::Draining);
                    deadline = Some(StopDeadline::starting_now(w.stop_timeout));
                }
            }
        }
    }
}
