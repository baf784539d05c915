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

mod segment;
mod swap;

pub(super) use segment::{FromExecutor, Segment, executor_thread};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender};

use super::Live;
use super::counts::LastCounts;
use super::live::{LiveSink, LiveSource, Parts, Phase};
use super::notify::Notifier;
use super::reload::{self, Current, Plan};
use super::shutdown::{SinkClosed, StopDeadline, close_sinks};
use crate::config::{self, ConfigError, ExecutorConfig, Pipeline, SinkConfig, Written};
use crate::frame::Frame;
use crate::sinks::SinkRunner;
use crate::source::{self, SourceConfig, SourceError, SourceHandle, SourceStats};
use crate::spec::SinkInput;
use crate::workflow::{Executor, ExecutorMetrics, Graph, PoolHandle, RunStats};

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
    /// A second stop request cut the shutdown short: what it left unfinished (frames queued or
    /// in flight, the pool's busy workers) was given up on request, not lost to a deadline.
    pub aborted: bool,
}

/// The running pipeline: its parts, and what is needed to change them.
pub(super) struct Supervisor {
    pub parts: RunParts,
    pub channels: Channels,
    /// Sinks closed at reloads.
    pub closed_sinks: Vec<SinkClosed>,
    /// Counts and errors of sources stopped at reloads.
    pub retired_stats: BTreeMap<String, SourceStats>,
    pub retired_errors: Vec<SourceError>,
    /// Sources told to stop by a reload, not ended yet.
    retired: Vec<Retired>,
    /// Coordinator wake-ups and step panics of the executors retired at reloads.
    pub retired_metrics: (u64, u64),
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

/// How the supervisor hears of stop and reload requests and talks to the executor's thread.
pub(super) struct Channels {
    pub requests: Receiver<()>,
    pub reloads: Receiver<()>,
    pub from_executor: Receiver<FromExecutor>,
    pub to_executor: Sender<Segment>,
    pub handing_over: Arc<AtomicBool>,
    /// Pauses (or at a stop, aborts) the running segment.
    pub pause: Sender<()>,
}

/// The running pipeline's parts; a reload replaces some of them.
pub(super) struct RunParts {
    pub path: PathBuf,
    pub live: Arc<Live>,
    pub stop_timeout: Duration,
    pub max_frames: Option<u64>,
    pub sources: Vec<RunningSource>,
    /// Every queue the executor takes frames from: the running sources', and those of sources
    /// that ended or were stopped by a reload (the executor drains what they hold).
    pub queues: Vec<Receiver<Frame>>,
    pub sinks: Vec<OpenSink>,
    /// Where the sinks index their files; a reload's sinks are opened with it too.
    pub storage: crate::storage::Storage,
    pub graph: Arc<Graph>,
    pub written: Written,
    pub executor_config: ExecutorConfig,
    pub http: Option<std::net::SocketAddr>,
    /// `[events]` as the store runs it: a reload keeps it (`reload::ignored`).
    pub events: Option<crate::events::EventsConfig>,
    pub last_counts: Arc<LastCounts>,
    pub taps: Arc<super::taps::Taps>,
    /// The daemon's pool; `None` for a one-shot run (a still image), which cannot reload.
    pub pool: Option<PoolHandle>,
    pub executor_metrics: Arc<ExecutorMetrics>,
}

impl Supervisor {
    pub(super) fn new(parts: RunParts, channels: Channels) -> Self {
        Self {
            parts,
            channels,
            closed_sinks: Vec::new(),
            retired_stats: BTreeMap::new(),
            retired_errors: Vec::new(),
            retired: Vec::new(),
            retired_metrics: (0, 0),
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
        self.parts.live.set_parts(Parts {
            sources: self
                .parts
                .sources
                .iter()
                .map(|s| LiveSource::of(&s.handle, s.config.uri.is_live()))
                .collect(),
            sinks: self
                .parts
                .sinks
                .iter()
                .map(|s| LiveSink {
                    name: s.runner.name().into(),
                    sender: s.runner.sender(),
                })
                .collect(),
            executor: Some(self.parts.executor_metrics.clone()),
            pool: self.parts.pool.as_ref().map(|p| p.metrics().clone()),
            storage: Some(self.parts.storage.clone()),
            events: self.parts.taps.store().cloned(),
        });
    }

    /// Blocks until the executor has drained, or the drain's share of the stop deadline is
    /// over. The deadline starts at the first stop request, or when every source has ended by
    /// itself (end of stream, error), or when the executor finished (a step error with
    /// `on_step_error = "stop"`): whatever ends the run. Reloads are carried out meanwhile.
    pub(super) fn wait(&mut self) -> Waited {
        let mut requests = self.channels.requests.clone();
        let mut reloads = self.channels.reloads.clone();
        loop {
            let timer = self.deadline.map_or_else(crossbeam_channel::never, |d| {
                crossbeam_channel::at(d.drain())
            });
            let loading = match &self.reload {
                Reload::Loading(rx) => rx.clone(),
                _ => crossbeam_channel::never(),
            };
            let running: Vec<usize> = (0..self.parts.sources.len())
                .filter(|&i| !self.parts.sources[i].ended)
                .collect();
            let retired: Vec<Receiver<()>> = self.retired.iter().map(|r| r.handle.done()).collect();
            let mut select = Select::new();
            let requests_at = select.recv(&requests);
            let reloads_at = select.recv(&reloads);
            let loaded_at = select.recv(&loading);
            let executor_at = select.recv(&self.channels.from_executor);
            let timer_at = select.recv(&timer);
            let first_source = timer_at + 1;
            let sources_done: Vec<Receiver<()>> = running
                .iter()
                .map(|&i| self.parts.sources[i].handle.done())
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
                i if i == executor_at => match op.recv(&self.channels.from_executor) {
                    Ok(FromExecutor::Paused(stats, executor)) => {
                        self.add(&stats);
                        self.paused(executor);
                    }
                    Ok(FromExecutor::Finished(stats, executor)) => {
                        self.add(&stats);
                        self.cancel_reload("the workflow ended");
                        let totals = std::mem::take(&mut self.totals);
                        return self.waited(Some((totals, executor)));
                    }
                    // The executor's thread panicked: nothing is left to wait for.
                    Err(_) => return self.waited(None),
                },
                i if i == timer_at => {
                    let _ = op.recv(&timer);
                    return self.waited(None);
                }
                i if i < first_retired => {
                    let _ = op.recv(&sources_done[i - first_source]);
                    self.parts.sources[running[i - first_source]].ended = true;
                    self.maybe_drain();
                }
                i => {
                    let _ = op.recv(&retired[i - first_retired]);
                    self.retired_ended(i - first_retired);
                }
            }
        }
    }

    /// The end of the wait: the stop deadline (started now if no stop request started it).
    fn waited(&mut self, finished: Option<(RunStats, Executor)>) -> Waited {
        Waited {
            finished,
            deadline: self.deadline_now(),
            aborted: self.stops > 1,
        }
    }

    fn deadline_now(&mut self) -> StopDeadline {
        *self
            .deadline
            .get_or_insert_with(|| StopDeadline::starting_now(self.parts.stop_timeout))
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
        if self.deadline.is_none() && !reloading && self.parts.sources.iter().all(|s| s.ended) {
            self.parts.live.set_phase(Phase::Draining);
            self.deadline = Some(StopDeadline::starting_now(self.parts.stop_timeout));
        }
    }

    fn stop_requested(&mut self) {
        self.stops += 1;
        if self.stops == 1 {
            tracing::info!(
                stop_timeout_s = self.parts.stop_timeout.as_secs(),
                "stop requested: draining (send again to stop at once)"
            );
            self.notifier.stopping();
            self.cancel_reload("a stop was requested");
            self.parts.live.set_phase(Phase::Draining);
            self.deadline = Some(StopDeadline::starting_now(self.parts.stop_timeout));
            for s in &self.parts.sources {
                s.handle.control().stop();
            }
        } else {
            tracing::warn!(
                "second stop request: stopping at once (queued frames are dropped, frames in \
                 flight get a second, the sinks still finalize their files)"
            );
            let first = self.deadline_now();
            self.deadline = Some(first.aborted());
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
        for s in &self.parts.sources {
            s.handle.control().abort();
        }
        let _ = self.channels.pause.send(());
    }
}

pub(super) fn add_source_stats(total: &mut SourceStats, more: &SourceStats) {
    total.decoded += more.decoded;
    total.dropped += more.dropped;
    total.reconnects += more.reconnects;
    total.size_changes += more.size_changes;
    total.attempts += more.attempts;
    total.throttled += more.throttled;
    total.copied += more.copied;
    total.cut += more.cut;
    total.abandoned += more.abandoned;
    total.missing += more.missing;
}
