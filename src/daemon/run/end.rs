//! The end of a run: the shutdown order over the running parts ([`Running::stop`]), then the
//! report of what came in, what went out and what was dropped ([`Ended::report`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::http::Server;
use super::super::shutdown::{
    DeliveredState, SinkClosed, SourcesStopped, close_in_order, stop_sources,
};
use super::super::supervise::{Supervisor, Waited, add_source_stats};
use super::super::{DaemonError, Failure, PoolReport, Report};
use super::start::Running;

use crate::workflow::{Executor, ExecutorMetrics, PoolError, PoolMetrics, RunStats};

/// The least time the endpoint's threads get to stop, when the stop deadline is past by then.
const HTTP_GRACE: Duration = Duration::from_secs(1);

/// What the shutdown left, for the report.
pub(super) struct Ended {
    sup: Supervisor,
    http: Option<Server>,
    stop_timeout: Duration,
    /// The stop deadline: the endpoint's threads are stopped by then (see [`HTTP_GRACE`]).
    deadline_end: Instant,
    aborted: bool,
    counts: DeliveredState,
    stopped: SourcesStopped,
    stats: Option<RunStats>,
    pool: PoolReport,
    pool_result: Result<(), PoolError>,
    sinks: Vec<SinkClosed>,
    /// What was left unfinished: lost to the stop deadline (an error), or given up at a second
    /// stop request (`cut_short`: counted and logged, not an error).
    abandoned: Vec<String>,
    cut_short: Vec<String>,
}

impl Running {
    /// Waits for the executor, taking stop requests (the first stops the sources gracefully and
    /// starts the stop deadline, the second aborts) and reloads; then stops the sources,
    /// drains the workflow (or gives it up at the deadline), joins the pool and closes the
    /// sinks, each even if an earlier stage failed.
    pub(super) fn stop(self) -> Ended {
        let Running {
            mut sup,
            thread,
            delivered,
            pool,
            pool_metrics,
            workers,
            http,
        } = self;
        let Waited {
            finished,
            deadline,
            aborted,
        } = sup.wait();
        let mut left = (Vec::new(), Vec::new());
        if finished.is_some() {
            // It has sent its last message: the join is immediate.
            let _ = thread.join();
        } else {
            // The drain did not end in time: stop admitting and delivering; what is queued or
            // in flight is counted as dropped, and the executor's thread is abandoned.
            if !aborted {
                tracing::error!(
                    "frames still in the workflow at the stop deadline; abandoning the drain"
                );
            }
            sup.abort();
            left_unfinished(&mut left, aborted, "the workflow's drain".to_owned());
        }
        let counts = delivered.close();

        // 1. The sources: stopped hard if still running (abort, or stop on step error), with
        // those a reload stopped that have not ended yet.
        let mut handles: Vec<_> = sup.parts.sources.drain(..).map(|s| s.handle).collect();
        handles.extend(sup.take_retired());
        let queues = std::mem::take(&mut sup.parts.queues);
        let mut stopped = stop_sources(handles, queues, deadline.joins());
        left.0.extend(stopped.abandoned.iter().cloned());
        for (name, stats) in std::mem::take(&mut sup.retired_stats) {
            add_source_stats(stopped.stats.entry(name).or_default(), &stats);
        }
        stopped.errors.append(&mut sup.retired_errors);
        // 2. Drained already, or abandoned above.
        let executor = finished.as_ref().map(|(_, executor)| executor);
        let report = PoolCounts {
            workers,
            daemon_pool: pool.is_some(),
            metrics: pool_metrics.or_else(|| executor.and_then(|e| e.pool_metrics())),
            retired: sup.retired_metrics,
        }
        .report(executor);
        // 3. The pool, then 4. the sinks, whatever happened before.
        let (stats, own_pool) = match finished {
            Some((stats, executor)) => (Some(stats), executor.close()),
            None => (None, Ok(())),
        };
        let runners = sup.parts.sinks.drain(..).map(|s| s.runner).collect();
        let (host_result, mut sinks) = close_in_order(pool, runners, &deadline);
        sinks.append(&mut sup.closed_sinks);
        let pool_result = own_pool.and(host_result);
        if let Err(PoolError::Abandoned(n)) = &pool_result {
            left_unfinished(
                &mut left,
                aborted,
                format!("{n} pool worker(s) busy in a step"),
            );
        }
        Ended {
            stop_timeout: sup.parts.stop_timeout,
            deadline_end: deadline.end(),
            sup,
            http,
            aborted,
            counts,
            stopped,
            stats,
            pool: report,
            pool_result,
            sinks,
            abandoned: left.0,
            cut_short: left.1,
        }
    }
}

/// What the pool's report is read from.
struct PoolCounts {
    /// The workers asked for at the start.
    workers: usize,
    /// Whether the daemon built its pool (`Pool::new` gave one).
    daemon_pool: bool,
    /// The daemon's pool's, or the one the one-shot executor built for itself.
    metrics: Option<Arc<PoolMetrics>>,
    /// What the executors retired at reloads counted: coordinator wakeups, step panics.
    retired: (u64, u64),
}

impl PoolCounts {
    fn report(self, executor: Option<&Executor>) -> PoolReport {
        let executor_count =
            |read: fn(&ExecutorMetrics) -> u64| executor.map_or(0, |e| read(e.metrics()));
        let pool_count =
            |read: fn(&PoolMetrics) -> u64| self.metrics.as_ref().map_or(0, |m| read(m));
        PoolReport {
            workers: self.workers,
            // Pools really started for this run: the daemon's and any the executor built for
            // itself (it counts its own).
            pools_built: u64::from(self.daemon_pool)
                + executor_count(|m| m.pools_built.load(Ordering::Relaxed)),
            dispatches: pool_count(|m| m.dispatches.load(Ordering::Relaxed)),
            wakeups: pool_count(|m| m.wakeups.load(Ordering::Relaxed)),
            coordinator_wakeups: self.retired.0
                + executor_count(|m| m.coordinator_wakeups.load(Ordering::Relaxed)),
            // Panics caught on the pool's threads outside any step, and in or around steps
            // (those the executor catches, wherever the step ran).
            panics: pool_count(|m| m.panics.load(Ordering::Relaxed))
                + self.retired.1
                + executor_count(|m| m.step_panics.load(Ordering::Relaxed)),
        }
    }
}

/// What each of the run's `sinks` that writes the record stream wrote, per source, from the
/// process's `rows` (`packets::Hub::record_rows`; a sink closed at a reload and opened again
/// under its name shares its row, so it is counted once, whole).
fn recordings(
    sinks: &BTreeMap<String, crate::sinks::SinkStats>,
    rows: &[crate::packets::RecordRow],
) -> BTreeMap<String, BTreeMap<String, crate::packets::RecordCounts>> {
    let mut out: BTreeMap<String, BTreeMap<String, _>> = BTreeMap::new();
    for row in rows.iter().filter(|r| sinks.contains_key(&*r.sink)) {
        out.entry(row.sink.to_string())
            .or_default()
            .insert(row.source.to_string(), row.stats.counts());
    }
    out
}

/// Names what a stage left unfinished: cut short at a second stop request, else abandoned at
/// the stop deadline (`left`: abandoned, cut short).
fn left_unfinished(left: &mut (Vec<String>, Vec<String>), aborted: bool, what: String) {
    if aborted {
        left.1.push(what);
    } else {
        left.0.push(what);
    }
}

impl Ended {
    /// The run's report, logged; an error for each source, step stop, pool or sink failure, and
    /// for what the stop deadline abandoned.
    pub(super) fn report(mut self, started: Instant) -> Result<Report, Failure> {
        let report = self.counted(started);
        let mut errors: Vec<DaemonError> = std::mem::take(&mut self.stopped.errors)
            .into_iter()
            .map(DaemonError::Source)
            .collect();
        if let Some(failure) = self.stats.take().and_then(|s| s.stopped_by) {
            errors.push(DaemonError::StepStop(failure));
        }
        match std::mem::replace(&mut self.pool_result, Ok(())) {
            Ok(()) | Err(PoolError::Abandoned(_)) => {}
            Err(e) => errors.push(DaemonError::Pool(e)),
        }
        let mut report = report;
        self.sink_errors(&mut report, &mut errors);
        report.recordings = recordings(&report.sinks, &crate::packets::hub().record_rows());
        tracing::info!(
            decoded = report.frames_decoded,
            processed = report.frames_processed,
            failed = report.frames_failed,
            dropped = report.frames_dropped,
            fps = format!("{:.1}", report.frames_per_second),
            "pipeline finished"
        );
        for line in super::super::count_lines(&report.counts) {
            tracing::info!("final counts: {line}");
        }
        // The endpoint answered while the run drained; it stops with the report made, by the
        // stop deadline (or HTTP_GRACE from now, when the drain used it up): a thread still
        // busy then (a viewer's socket it would not let go) is abandoned like the others.
        if let Some(http) = self.http.take() {
            let until = self.deadline_end.max(Instant::now() + HTTP_GRACE);
            for name in http.stop_by(until) {
                let what = format!("http thread \"{name}\"");
                if self.aborted {
                    self.cut_short.push(what);
                } else {
                    self.abandoned.push(what);
                }
            }
        }
        if !self.cut_short.is_empty() {
            tracing::warn!(
                left = %self.cut_short.join(", "),
                "stopped at once on a second stop request"
            );
        }
        if !self.abandoned.is_empty() {
            let what = self.abandoned.join(", ");
            tracing::error!(abandoned = %what, "stop deadline reached");
            errors.push(DaemonError::StopDeadline {
                timeout_s: self.stop_timeout.as_secs(),
                abandoned: what,
            });
        }
        std::mem::take(&mut self.sup.notifier).stop();
        if errors.is_empty() {
            Ok(report)
        } else {
            Err(Failure {
                report: Some(Box::new(report)),
                errors,
            })
        }
    }

    /// Every decoded frame is processed, failed or dropped: what the sources dropped and the
    /// frames left in their queues are known; the rest were in the workflow when it was given
    /// up (`lost`). A source abandoned while still running may count a frame between its two
    /// counters: `frames_decoded` is then the sum, so the invariant holds whatever.
    fn counted(&mut self, started: Instant) -> Report {
        let (counts, stopped) = (self.counts, &mut self.stopped);
        let source_dropped: u64 = stopped.stats.values().map(|s| s.dropped).sum();
        let decoded: u64 = stopped.stats.values().map(|s| s.decoded).sum();
        let known = source_dropped + stopped.leftover + counts.processed + counts.failed;
        let lost = decoded.saturating_sub(known);
        if lost > 0 && self.aborted {
            self.cut_short
                .push(format!("{lost} frame(s) in flight, counted as dropped"));
        } else if lost > 0 {
            tracing::error!(
                frames = lost,
                "frames abandoned at the stop deadline, counted as dropped"
            );
            self.abandoned.push(format!("{lost} frame(s)"));
        }
        let wall = started.elapsed().as_secs_f64();
        Report {
            frames_decoded: decoded.max(known),
            frames_processed: counts.processed,
            frames_failed: counts.failed,
            frames_dropped: source_dropped + stopped.leftover + lost,
            sources: std::mem::take(&mut stopped.stats),
            record_streams: std::mem::take(&mut stopped.record),
            sinks: BTreeMap::new(),
            recordings: BTreeMap::new(),
            wall_seconds: wall,
            frames_per_second: if wall > 0.0 {
                (counts.processed + counts.failed) as f64 / wall
            } else {
                0.0
            },
            pool: self.pool.clone(),
            counts: self.sup.parts.last_counts.take(),
            storage: self.sup.parts.storage.report(),
        }
    }

    /// Adds each sink's counts to the report (a sink closed at a reload and opened again under
    /// its name is counted once, whole), with an error for each that failed or lost frames.
    fn sink_errors(&mut self, report: &mut Report, errors: &mut Vec<DaemonError>) {
        for (name, stats, result) in std::mem::take(&mut self.sinks) {
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
                None => self.abandoned.push(format!("sink \"{name}\"")),
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
    }
}
