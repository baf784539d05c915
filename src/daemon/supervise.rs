//! A pipeline between its start and its shutdown: stop requests, reloads (SIGHUP), and the
//! executor's thread.
//!
//! Threads: the daemon's thread blocks in one select ([`Supervisor::wait`]) over stop requests,
//! reload requests, the result of a reload's loading, messages from the executor's thread, the
//! end of each source, and the drain's deadline. A reload's file is read and its steps built
//! (models loaded) on a `vidflow-reload` thread, so that a slow load never holds a stop
//! request. The executor's thread (`vidflow-executor`) runs one [`Segment`] at a time: an
//! executor over the sources' queues, delivering to the sinks, until the segment's `pause`
//! channel fires (stop admitting, finish what is in flight) or every queue has closed. It then
//! reports `Paused` if the daemon had asked for a hand-over (`handing_over`, raised before the
//! pause is sent, so that a segment whose queues all close during a reload is not taken for the
//! end of the run), and waits for the next segment; otherwise `Finished`.
//!
//! A reload, in order:
//! 1. SIGHUP: `RELOADING=1`, and the file is loaded. Invalid: every problem is logged with its
//!    line:column and the running pipeline goes on untouched; `READY=1`.
//! 2. Valid: the plan (`reload.rs`). Sinks that are new or changed are opened (if one cannot
//!    be, the reload is refused and the ones just opened are closed). Changed and removed
//!    sources are told to stop; what they decoded still goes through the running workflow.
//! 3. Once the changed ones have ended: the segment is paused. No frame is admitted; frames in
//!    flight finish and are delivered; queued frames stay in their queues. Replaced sinks are
//!    closed (files finalized), changed sources start again from their predecessor's frame
//!    number, new ones start, and the executor's thread gets a new segment: the new graph (kept
//!    steps carried over, state and all) on the same pool, with the kept and the new sinks, over
//!    the same queues. `READY=1`.
//!
//! A stop request during a reload cancels it: the sinks opened for it are closed, and the
//! running segment drains as at any stop. No frame is lost at a swap: the queues are the same
//! before and after; a live queue that fills while the swap holds the workflow drops its oldest
//! frame and counts it, as it always does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};

use super::Live;
use super::counts::LastCounts;
use super::live::{LiveSink, LiveSource, Parts, Phase};
use super::notify::Notifier;
use super::reload::{self, Current, Plan};
use super::shutdown::{Delivered, SinkClosed, StopDeadline, close_sinks};
use crate::config::{self, ConfigError, ExecutorConfig, Pipeline, SinkConfig, Written};
use crate::frame::Frame;
use crate::sinks::{SinkRunner, SinkSender};
use crate::source::{self, SourceConfig, SourceError, SourceHandle, SourceStats};
use crate::spec::SinkInput;
use crate::workflow::{Executor, ExecutorMetrics, Graph, PoolHandle, RunStats};

/// How long a reload waits for the sinks it replaces to write what they hold and finalize
/// their files; a sink still busy then is abandoned (named in the log) so the workflow can go
/// on. Encoders finalize in well under a second.
const RELOAD_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the executor's thread runs until it is paused or its queues close.
pub(super) struct Segment {
    pub executor: Executor,
    pub queues: Vec<Receiver<Frame>>,
    pub sinks: Vec<SinkSender>,
    pub last_counts: Arc<LastCounts>,
    /// Ends the segment: no more frames admitted, those in flight finish.
    pub pause: Receiver<()>,
}

/// From the executor's thread.
pub(super) enum FromExecutor {
    /// Drained for a swap; the thread waits for the next segment.
    Paused(RunStats, Executor),
    /// The run's workflow is over.
    Finished(RunStats, Executor),
}

/// The executor's thread: segment after segment, until one ends without a hand-over.
pub(super) fn executor_thread(
    first: Segment,
    next: &Receiver<Segment>,
    handing_over: &AtomicBool,
    out: &Sender<FromExecutor>,
    delivered: &Delivered,
    live: &Live,
) {
    let mut segment = first;
    loop {
        let Segment {
            mut executor,
            queues,
            sinks,
            last_counts,
            pause,
        } = segment;
        let stats = executor.run_sources(&queues, &pause, |result| {
            if delivered.count(&result) {
                live.count_delivered(result.failure().is_some());
                last_counts.record(&result);
                for sink in &sinks {
                    sink.send(result.clone());
                }
            }
        });
        // The old senders go before the daemon closes the sinks they fed.
        drop((queues, sinks, last_counts));
        let swap = stats.stopped_by.is_none() && handing_over.swap(false, Ordering::AcqRel);
        if !swap {
            let _ = out.send(FromExecutor::Finished(stats, executor));
            return;
        }
        if out.send(FromExecutor::Paused(stats, executor)).is_err() {
            return;
        }
        match next.recv() {
            Ok(s) => segment = s,
            Err(_) => return,
        }
    }
}

/// A running source and the settings it was started with.
pub(super) struct RunningSource {
    pub handle: SourceHandle,
    pub config: SourceConfig,
    /// Its supervisor has returned (end of file, gave up, or a stop).
    pub ended: bool,
}

/// A source told to stop by a reload; joined when it ends.
struct Retired {
    handle: SourceHandle,
    /// Index in the reload's new sources of its successor, for a changed source.
    successor: Option<usize>,
}

/// An open sink and what it reads (to compare at a reload).
pub(super) struct OpenSink {
    pub runner: SinkRunner,
    pub inputs: Vec<SinkInput>,
}

/// A valid reload in progress (stage 2 and 3 above).
struct Prepared {
    new: Pipeline,
    plan: Plan,
    /// Per new sink: opened for this reload (`None`: the running one is kept).
    opened: Vec<Option<SinkRunner>>,
    /// Per new source: where a restarted one carries on from, once its predecessor ended.
    resume: Vec<Option<source::Resume>>,
    /// Changed sources not ended yet.
    waiting: usize,
    /// When the pause was sent: from then until the swap no frame is admitted.
    paused_at: Option<Instant>,
}

enum Reload {
    Idle,
    /// The file is being loaded; the answer comes on this channel (one per load, so that a
    /// cancelled load's late answer is never taken for the next one's).
    Loading(Receiver<Result<Pipeline, String>>),
    /// Waiting for changed sources to end.
    Stopping(Box<Prepared>),
    /// The pause is sent; waiting for the executor's thread to drain.
    Pausing(Box<Prepared>),
    /// Drained before the changed sources ended (their queues closed first): the executor
    /// waits here for them.
    Drained(Box<Prepared>, Executor),
}

/// How the drain ended (see [`Supervisor::wait`]).
pub(super) struct Waited {
    /// The executor's totals over every segment, and the last executor; `None`: the drain was
    /// not over by its deadline.
    pub finished: Option<(RunStats, Executor)>,
    pub deadline: StopDeadline,
}

/// The running pipeline: its parts, and what is needed to change them.
pub(super) struct Supervisor {
    pub requests: Receiver<()>,
    pub reloads: Receiver<()>,
    pub path: PathBuf,
    pub live: Arc<Live>,
    pub stop_timeout: Duration,
    pub max_frames: Option<u64>,
    pub sources: Vec<RunningSource>,
    /// Every queue the executor takes frames from: the running sources', and those of sources
    /// that ended or were stopped by a reload (the executor drains what they hold).
    pub queues: Vec<Receiver<Frame>>,
    pub sinks: Vec<OpenSink>,
    /// Sinks closed at reloads.
    pub closed_sinks: Vec<SinkClosed>,
    /// Counts and errors of sources stopped at reloads.
    pub retired_stats: BTreeMap<String, SourceStats>,
    pub retired_errors: Vec<SourceError>,
    /// Sources told to stop by a reload, not ended yet.
    retired: Vec<Retired>,
    pub graph: Arc<Graph>,
    pub written: Written,
    pub executor_config: ExecutorConfig,
    pub http: Option<std::net::SocketAddr>,
    pub last_counts: Arc<LastCounts>,
    /// The daemon's pool; `None` for a one-shot run (a still image), which cannot reload.
    pub pool: Option<PoolHandle>,
    pub executor_metrics: Arc<ExecutorMetrics>,
    /// Coordinator wake-ups and step panics of the executors retired at reloads.
    pub retired_metrics: (u64, u64),
    pub from_executor: Receiver<FromExecutor>,
    pub to_executor: Sender<Segment>,
    pub handing_over: Arc<AtomicBool>,
    /// Pauses (or at a stop, aborts) the running segment.
    pub pause: Sender<()>,
    /// Tells systemd (set once the run is up): `STOPPING=1`, and `RELOADING=1` then
    /// `READY=1` around a reload.
    pub notifier: Notifier,
    stops: u32,
    deadline: Option<StopDeadline>,
    reload: Reload,
    /// Another reload was requested while one was under way.
    again: bool,
    totals: RunStats,
}

/// What [`Supervisor::new`] needs besides the running parts.
pub(super) struct Channels {
    pub requests: Receiver<()>,
    pub reloads: Receiver<()>,
    pub from_executor: Receiver<FromExecutor>,
    pub to_executor: Sender<Segment>,
    pub handing_over: Arc<AtomicBool>,
    pub pause: Sender<()>,
}

/// The running parts at the start.
pub(super) struct Parts0 {
    pub path: PathBuf,
    pub live: Arc<Live>,
    pub stop_timeout: Duration,
    pub max_frames: Option<u64>,
    pub sources: Vec<RunningSource>,
    pub queues: Vec<Receiver<Frame>>,
    pub sinks: Vec<OpenSink>,
    pub graph: Arc<Graph>,
    pub written: Written,
    pub executor_config: ExecutorConfig,
    pub http: Option<std::net::SocketAddr>,
    pub last_counts: Arc<LastCounts>,
    pub pool: Option<PoolHandle>,
    pub executor_metrics: Arc<ExecutorMetrics>,
}

impl Supervisor {
    pub(super) fn new(p: Parts0, c: Channels) -> Self {
        Self {
            requests: c.requests,
            reloads: c.reloads,
            path: p.path,
            live: p.live,
            stop_timeout: p.stop_timeout,
            max_frames: p.max_frames,
            sources: p.sources,
            queues: p.queues,
            sinks: p.sinks,
            closed_sinks: Vec::new(),
            retired_stats: BTreeMap::new(),
            retired_errors: Vec::new(),
            retired: Vec::new(),
            graph: p.graph,
            written: p.written,
            executor_config: p.executor_config,
            http: p.http,
            last_counts: p.last_counts,
            pool: p.pool,
            executor_metrics: p.executor_metrics,
            retired_metrics: (0, 0),
            from_executor: c.from_executor,
            to_executor: c.to_executor,
            handing_over: c.handing_over,
            pause: c.pause,
            notifier: Notifier::default(),
            stops: 0,
            deadline: None,
            reload: Reload::Idle,
            again: false,
            totals: RunStats::default(),
        }
    }

    /// What observers see of the running parts.
    pub(super) fn publish(&self) {
        self.live.set_parts(Parts {
            sources: self
                .sources
                .iter()
                .map(|s| LiveSource::of(&s.handle, s.config.uri.is_live()))
                .collect(),
            sinks: self
                .sinks
                .iter()
                .map(|s| LiveSink {
                    name: s.runner.name().into(),
                    sender: s.runner.sender(),
                })
                .collect(),
            executor: Some(self.executor_metrics.clone()),
            pool: self.pool.as_ref().map(|p| p.metrics().clone()),
        });
    }

    /// Blocks until the executor has drained, or the drain's share of the stop deadline is
    /// over. The deadline starts at the first stop request, or when every source has ended by
    /// itself (end of stream, error), or when the executor finished (a step error with
    /// `on_step_error = "stop"`): whatever ends the run. Reloads are carried out meanwhile.
    pub(super) fn wait(&mut self) -> Waited {
        let mut requests = self.requests.clone();
        let mut reloads = self.reloads.clone();
        loop {
            let timer = self.deadline.map_or_else(crossbeam_channel::never, |d| {
                crossbeam_channel::at(d.drain())
            });
            let loading = match &self.reload {
                Reload::Loading(rx) => rx.clone(),
                _ => crossbeam_channel::never(),
            };
            let running: Vec<usize> = (0..self.sources.len())
                .filter(|&i| !self.sources[i].ended)
                .collect();
            let retired: Vec<Receiver<()>> = self.retired.iter().map(|r| r.handle.done()).collect();
            let mut select = Select::new();
            let requests_at = select.recv(&requests);
            let reloads_at = select.recv(&reloads);
            let loaded_at = select.recv(&loading);
            let executor_at = select.recv(&self.from_executor);
            let timer_at = select.recv(&timer);
            let first_source = timer_at + 1;
            let sources_done: Vec<Receiver<()>> = running
                .iter()
                .map(|&i| self.sources[i].handle.done())
                .collect();
            for done in &sources_done {
                select.recv(done);
            }
            let first_retired = first_source + sources_done.len();
            for done in &retired {
                select.recv(done);
            }
            let op = select.select();
            match op.index() {
                i if i == requests_at => {
                    if op.recv(&requests).is_err() {
                        requests = crossbeam_channel::never();
                    } else {
                        self.stop_requested();
                    }
                }
                i if i == reloads_at => {
                    if op.recv(&reloads).is_err() {
                        reloads = crossbeam_channel::never();
                    } else {
                        self.reload_requested();
                    }
                }
                i if i == loaded_at => match op.recv(&loading) {
                    Ok(loaded) => self.loaded(loaded),
                    Err(_) => {
                        tracing::error!(
                            "reload: the loader's thread died; keeping the running pipeline"
                        );
                        self.reload_done();
                    }
                },
                i if i == executor_at => match op.recv(&self.from_executor) {
                    Ok(FromExecutor::Paused(stats, executor)) => {
                        self.add(&stats);
                        self.paused(executor);
                    }
                    Ok(FromExecutor::Finished(stats, executor)) => {
                        self.add(&stats);
                        self.cancel_reload("the workflow ended");
                        let deadline = self.deadline_now();
                        return Waited {
                            finished: Some((std::mem::take(&mut self.totals), executor)),
                            deadline,
                        };
                    }
                    // The executor's thread panicked: nothing is left to wait for.
                    Err(_) => {
                        let deadline = self.deadline_now();
                        return Waited {
                            finished: None,
                            deadline,
                        };
                    }
                },
                i if i == timer_at => {
                    let _ = op.recv(&timer);
                    let deadline = self.deadline_now();
                    return Waited {
                        finished: None,
                        deadline,
                    };
                }
                i if i < first_retired => {
                    let _ = op.recv(&sources_done[i - first_source]);
                    self.sources[running[i - first_source]].ended = true;
                    self.maybe_drain();
                }
                i => {
                    let _ = op.recv(&retired[i - first_retired]);
                    self.retired_ended(i - first_retired);
                }
            }
        }
    }

    fn deadline_now(&mut self) -> StopDeadline {
        *self
            .deadline
            .get_or_insert_with(|| StopDeadline::starting_now(self.stop_timeout))
    }

    fn add(&mut self, stats: &RunStats) {
        self.totals.admitted += stats.admitted;
        self.totals.processed += stats.processed;
        self.totals.failed += stats.failed;
        if self.totals.stopped_by.is_none() {
            self.totals.stopped_by.clone_from(&stats.stopped_by);
        }
    }

    /// Every running source ended by itself and no reload will start another: drain.
    fn maybe_drain(&mut self) {
        let reloading = !matches!(self.reload, Reload::Idle);
        if self.deadline.is_none() && !reloading && self.sources.iter().all(|s| s.ended) {
            self.live.set_phase(Phase::Draining);
            self.deadline = Some(StopDeadline::starting_now(self.stop_timeout));
        }
    }

    fn stop_requested(&mut self) {
        self.stops += 1;
        if self.stops == 1 {
            tracing::info!(
                stop_timeout_s = self.stop_timeout.as_secs(),
                "stop requested: draining (send again to stop at once)"
            );
            self.notifier.stopping();
            self.cancel_reload("a stop was requested");
            self.live.set_phase(Phase::Draining);
            self.deadline = Some(StopDeadline::starting_now(self.stop_timeout));
            for s in &self.sources {
                s.handle.control().stop();
            }
        } else {
            tracing::warn!("second stop request: aborting");
            self.abort();
        }
    }

    /// Sources told to stop by a reload that have not ended: the shutdown stops and joins them
    /// with the others.
    pub(super) fn take_retired(&mut self) -> Vec<SourceHandle> {
        self.retired.drain(..).map(|r| r.handle).collect()
    }

    /// Stops admitting frames and every source at once.
    pub(super) fn abort(&self) {
        for s in &self.sources {
            s.handle.control().abort();
        }
        let _ = self.pause.send(());
    }

    fn reload_requested(&mut self) {
        if self.stops > 0 || self.deadline.is_some() {
            tracing::info!("reload requested while stopping: ignored");
            return;
        }
        if self.pool.is_none() {
            tracing::warn!("reload requested: a still image runs once; nothing to reload");
            return;
        }
        if !matches!(self.reload, Reload::Idle) {
            // The one under way runs to its end; the file is read again after it.
            tracing::info!("reload requested while one is under way: loading again after it");
            self.again = true;
            return;
        }
        tracing::info!(path = %self.path.display(), "reload requested: loading the pipeline file");
        self.notifier.reloading();
        self.live.set_phase(Phase::Reloading);
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.reload = Reload::Loading(rx);
        let path = self.path.clone();
        let spawned = std::thread::Builder::new()
            .name("vidflow-reload".to_owned())
            .spawn(move || {
                let _ = tx.send(load(&path));
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "reload: cannot start its thread; keeping the running pipeline");
            self.reload_done();
        }
    }

    /// The loader's answer.
    fn loaded(&mut self, loaded: Result<Pipeline, String>) {
        let new = match loaded {
            Ok(new) => new,
            Err(problems) => {
                for line in problems.lines() {
                    tracing::error!("reload: {line}");
                }
                tracing::error!("reload refused: keeping the running pipeline");
                self.reload_done();
                return;
            }
        };
        if new.sources.iter().any(|s| s.uri.is_still_image()) {
            tracing::error!(
                "reload refused: a still image cannot join a running stream (restart to run it)"
            );
            self.reload_done();
            return;
        }
        let sink_inputs: Vec<(Arc<str>, Vec<SinkInput>)> = self
            .sinks
            .iter()
            .map(|s| (Arc::<str>::from(s.runner.name()), s.inputs.clone()))
            .collect();
        let sources: Vec<SourceConfig> = self.sources.iter().map(|s| s.config.clone()).collect();
        let plan = reload::plan(
            &Current {
                sources: &sources,
                graph: &self.graph,
                sinks: &sink_inputs,
                written: &self.written,
                executor: self.executor_config,
                http: self.http,
            },
            &new,
        );
        for line in &plan.ignored {
            tracing::warn!("reload: {line}");
        }
        if plan.is_empty(&new) {
            tracing::info!("reload: nothing changed that runs");
            self.adopt_settings(&new);
            self.reload_done();
            return;
        }
        let Some(opened) = open_sinks(&new.sinks, &plan.kept_sinks) else {
            tracing::error!("reload refused: keeping the running pipeline");
            self.reload_done();
            return;
        };
        let resume = vec![None; new.sources.len()];
        let mut prepared = Box::new(Prepared {
            plan,
            opened,
            resume,
            waiting: 0,
            paused_at: None,
            new,
        });
        // Changed and removed sources stop; what they decoded is still processed.
        let mut stopping: Vec<(usize, Option<usize>)> = prepared
            .plan
            .sources
            .restart
            .iter()
            .map(|&(old, new)| (old, Some(new)))
            .collect();
        stopping.extend(prepared.plan.sources.remove.iter().map(|&old| (old, None)));
        stopping.sort_unstable_by_key(|&(old, _)| std::cmp::Reverse(old));
        // A segment whose queues all close now must pause, not end the run.
        self.handing_over.store(true, Ordering::Release);
        for (old, successor) in stopping {
            let running = self.sources.remove(old);
            tracing::info!(source = %running.config.name, "reload: stopping source");
            running.handle.control().stop();
            if successor.is_some() {
                prepared.waiting += 1;
            }
            self.retired.push(Retired {
                handle: running.handle,
                successor,
            });
        }
        if prepared.waiting == 0 {
            self.pause_for(prepared);
        } else {
            self.reload = Reload::Stopping(prepared);
        }
    }

    fn pause_for(&mut self, mut prepared: Box<Prepared>) {
        prepared.paused_at = Some(Instant::now());
        self.handing_over.store(true, Ordering::Release);
        let _ = self.pause.send(());
        self.reload = Reload::Pausing(prepared);
    }

    fn retired_ended(&mut self, i: usize) {
        let Retired { handle, successor } = self.retired.remove(i);
        let name = handle.name().to_string();
        let resume = handle.resume_point();
        let stats = handle.counters().snapshot();
        if let Err(e) = handle.join() {
            self.retired_errors.push(e);
        }
        add_source_stats(self.retired_stats.entry(name).or_default(), &stats);
        let Some(successor) = successor else { return };
        let (Reload::Stopping(prepared) | Reload::Drained(prepared, _)) = &mut self.reload else {
            return;
        };
        prepared.resume[successor] = Some(resume);
        prepared.waiting -= 1;
        if prepared.waiting > 0 {
            return;
        }
        match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Stopping(prepared) => self.pause_for(prepared),
            Reload::Drained(prepared, executor) => {
                let executor = self.swap(*prepared, executor);
                self.resume(executor);
                self.reload_done();
            }
            other => self.reload = other,
        }
    }

    /// The executor's thread drained its segment: swap, or (a cancelled reload) go on as before.
    fn paused(&mut self, executor: Executor) {
        match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Pausing(prepared) => {
                let executor = self.swap(*prepared, executor);
                self.resume(executor);
                self.reload_done();
            }
            // Every queue closed before the changed sources ended: wait for them.
            Reload::Stopping(prepared) => self.reload = Reload::Drained(prepared, executor),
            // A cancelled reload: go on as before.
            other => {
                self.reload = other;
                self.resume(executor);
            }
        }
    }

    /// Gives the executor's thread its next segment: `executor` over every queue, delivering to
    /// the open sinks.
    fn resume(&mut self, executor: Executor) {
        let (pause, paused) = crossbeam_channel::unbounded();
        if self.stops > 1 {
            // Aborting: the new segment admits nothing.
            let _ = pause.send(());
        }
        self.pause = pause;
        // Queues of sources that ended stay listed: a closed one costs the executor one wake-up
        // per segment, and reloads are rare.
        let segment = Segment {
            executor,
            queues: self.queues.clone(),
            sinks: self.sinks.iter().map(|s| s.runner.sender()).collect(),
            last_counts: self.last_counts.clone(),
            pause: paused,
        };
        if self.to_executor.send(segment).is_err() {
            tracing::error!("the executor's thread is gone");
        }
    }

    /// Carries a prepared reload out while the workflow is paused; returns the new executor.
    fn swap(&mut self, prepared: Prepared, old: Executor) -> Executor {
        let Prepared {
            mut new,
            plan,
            opened,
            resume,
            paused_at,
            ..
        } = prepared;
        let metrics = old.metrics();
        self.retired_metrics.0 += metrics.coordinator_wakeups.load(Ordering::Relaxed);
        self.retired_metrics.1 += metrics.step_panics.load(Ordering::Relaxed);
        drop(old);

        // Sinks: the kept ones, then the new ones, in the new file's order; the rest closed.
        let mut running: Vec<Option<OpenSink>> = self.sinks.drain(..).map(Some).collect();
        let closing: Vec<SinkRunner> = plan
            .closed_sinks
            .iter()
            .filter_map(|&i| running[i].take().map(|s| s.runner))
            .collect();
        let closed = close_sinks(closing, Some(Instant::now() + RELOAD_CLOSE_TIMEOUT));
        for (name, _, result) in &closed {
            match result {
                Some(Ok(())) => tracing::info!(sink = %name, "reload: sink closed"),
                Some(Err(e)) => {
                    tracing::error!(sink = %name, error = %e, "reload: sink closed with an error")
                }
                None => {}
            }
        }
        self.closed_sinks.extend(closed);
        let configs = std::mem::take(&mut new.sinks);
        for ((config, kept), opened) in configs.into_iter().zip(&plan.kept_sinks).zip(opened) {
            let sink = match (kept, opened) {
                (Some(i), _) => running[*i].take(),
                (None, Some(runner)) => {
                    tracing::info!(sink = %config.name, "reload: sink opened");
                    Some(OpenSink {
                        runner,
                        inputs: config.inputs,
                    })
                }
                (None, None) => None,
            };
            self.sinks.extend(sink);
        }

        // Steps: kept ones carry their instance (and state) over.
        let mut steps = std::mem::take(&mut new.steps);
        for (step, kept) in steps.iter_mut().zip(&plan.kept_steps) {
            if let Some(i) = kept {
                step.step = self.graph.nodes[*i].step.clone();
            }
        }
        let kept = plan.kept_steps.iter().flatten().count();
        self.graph = Arc::new(Graph::new(steps));
        self.last_counts = Arc::new(self.last_counts.carried_to(&self.graph));
        self.written = std::mem::take(&mut new.written);

        // Sources: restarted and new ones start now.
        let mut started = 0;
        let mut configs: Vec<Option<SourceConfig>> = std::mem::take(&mut new.sources)
            .into_iter()
            .map(Some)
            .collect();
        let starts = plan
            .sources
            .restart
            .iter()
            .map(|&(_, j)| j)
            .chain(plan.sources.add.iter().copied());
        let starts: Vec<usize> = starts.collect();
        for j in starts {
            let Some(config) = configs[j].take() else {
                continue;
            };
            let from = resume[j].unwrap_or_default();
            let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
            match source::start_from(&config, tx, &rx, self.max_frames, from) {
                Ok(handle) => {
                    started += 1;
                    self.queues.push(rx);
                    self.sources.push(RunningSource {
                        handle,
                        config,
                        ended: false,
                    });
                }
                Err(e) => tracing::error!(error = %e, "reload: source cannot start"),
            }
        }
        self.adopt_settings(&new);
        let mut config = new.executor;
        config.workers = self.executor_config.workers;
        self.executor_config = config;
        let executor = match &self.pool {
            Some(pool) => Executor::new(self.graph.clone(), pool.clone(), config),
            None => Executor::owning(self.graph.clone(), config),
        };
        self.executor_metrics = executor.metrics().clone();
        self.publish();
        tracing::info!(
            steps = self.graph.len(),
            steps_kept = kept,
            sinks = self.sinks.len(),
            sinks_kept = plan.kept_sinks.iter().flatten().count(),
            sources_started = started,
            sources_stopped = plan.sources.remove.len() + plan.sources.restart.len(),
            held_ms = format!(
                "{:.1}",
                paused_at.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3)
            ),
            "reload applied"
        );
        executor
    }

    /// Settings a reload changes without a swap.
    fn adopt_settings(&mut self, new: &Pipeline) {
        self.stop_timeout = new.daemon.stop_timeout;
        if new.executor.opencv_threads != self.executor_config.opencv_threads {
            let threads = i32::try_from(new.executor.opencv_threads).unwrap_or(1);
            if let Err(e) = opencv::core::set_num_threads(threads) {
                tracing::warn!(error = %e, "cannot limit OpenCV's threads");
            }
            self.executor_config.opencv_threads = new.executor.opencv_threads;
        }
    }

    /// A stop or the end of the workflow during a reload: undo what it opened.
    fn cancel_reload(&mut self, why: &str) {
        self.again = false;
        let (stage, prepared) = match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Idle => return,
            Reload::Loading(_) => ("loading", None),
            Reload::Stopping(p) => ("stopping sources", Some(p)),
            Reload::Pausing(p) => ("pausing", Some(p)),
            Reload::Drained(p, executor) => {
                self.resume(executor);
                ("drained", Some(p))
            }
        };
        tracing::info!(stage, "reload cancelled: {why}");
        if let Some(prepared) = prepared {
            let opened: Vec<SinkRunner> = prepared.opened.into_iter().flatten().collect();
            let _ = close_sinks(opened, Some(Instant::now() + RELOAD_CLOSE_TIMEOUT));
        }
    }

    /// The reload under way is over (applied, refused or cancelled).
    fn reload_done(&mut self) {
        self.reload = Reload::Idle;
        if self.stops == 0 && self.deadline.is_none() {
            self.live.set_phase(Phase::Running);
            self.notifier.ready();
        }
        self.maybe_drain();
        if std::mem::take(&mut self.again) {
            self.reload_requested();
        }
    }
}

/// Reads and checks the pipeline file again (on the loader's thread): every problem, one per
/// line, or the pipeline with its steps built.
fn load(path: &std::path::Path) -> Result<Pipeline, String> {
    let pipeline = config::load(path).map_err(|e| match e {
        ConfigError::Invalid { problems } => problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    })?;
    let missing: Vec<String> = pipeline
        .sources
        .iter()
        .filter_map(|s| source::check(s).err())
        .map(|e| e.to_string())
        .collect();
    if missing.is_empty() {
        Ok(pipeline)
    } else {
        Err(missing.join("\n"))
    }
}

/// Opens the sinks a reload does not keep; `None` (and every one opened closed again) if one
/// cannot be opened.
fn open_sinks(configs: &[SinkConfig], kept: &[Option<usize>]) -> Option<Vec<Option<SinkRunner>>> {
    let mut opened = Vec::new();
    for (config, kept) in configs.iter().zip(kept) {
        if kept.is_some() {
            opened.push(None);
            continue;
        }
        let runner = config
            .factory
            .open(&config.name, &config.inputs)
            .and_then(|sink| SinkRunner::spawn(&config.name, sink, config.routing.clone()));
        match runner {
            Ok(runner) => opened.push(Some(runner)),
            Err(e) => {
                tracing::error!(sink = %config.name, error = %e, "reload: sink cannot open");
                let _ = close_sinks(opened.into_iter().flatten().collect(), None);
                return None;
            }
        }
    }
    Some(opened)
}

pub(super) fn add_source_stats(total: &mut SourceStats, more: &SourceStats) {
    total.decoded += more.decoded;
    total.dropped += more.dropped;
    total.reconnects += more.reconnects;
    total.attempts += more.attempts;
    total.throttled += more.throttled;
}
