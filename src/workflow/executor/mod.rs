//! Runs the workflow DAG on every frame, on one persistent pool.
//!
//! Threads: the coordinator is the thread that calls [`Executor::run`] (which takes `&mut self`,
//! so there is one per executor at a time); it blocks in one select over: the frame channel of
//! each source (each bounded by its source's `queue`), finished frames from the workers (`done`,
//! unbounded but never holding more than `max_in_flight` entries, since a frame is only admitted
//! when fewer than that are in flight) and an abort channel. Steps run on the pool's workers
//! (and some on the coordinator, below).
//!
//! Sources: every frame belongs to a lane, one per source name (`Frame::source`), numbered in
//! admission order within that lane (`reorder.rs`). Order is kept per source only: sources never
//! wait for each other.
//!
//! Scheduling (`run.rs`, `claims.rs`): each frame gets a `Run` with an atomic count of
//! unfinished predecessors per node. A node is queued exactly once, by whoever brings that count
//! to zero (the coordinator for root nodes); a worker that finishes a node runs one newly ready
//! successor itself and queues the others; when three or more become ready together, at most
//! one pool job per worker is queued and those jobs and this thread claim the ready nodes one by
//! one, so a wide fan-out does not cost a job per node. A frame that arrives while no other
//! frame is in flight and none waits behind it (a live source between frames), or that takes
//! the last free place in the workflow, has its first root run by the coordinator itself, chain
//! included: no worker is woken for work the coordinator could only wait for. That is done only
//! while a single source is open: with several, the coordinator must stay free to admit and
//! deliver the other sources' frames; and only for frames whose steps took under
//! `COORDINATOR_FRAME_MAX_US` on average so far: a heavier frame would keep the coordinator from
//! delivering and admitting while a worker that finished waits for work.
//!
//! Gates (`gate.rs`): a stateful node (see `StepKind::stateful`) has one gate per lane, so it
//! sees the frames of a source strictly in that source's admission order, one at a time, while
//! the frames of other sources pass their own gates at the same moment. Stateless nodes of
//! different frames run concurrently.
//!
//! Ordering (`reorder.rs`): when a frame's last node finishes, the frame goes back to the
//! coordinator over `done`; the coordinator delivers it as soon as every earlier frame of the
//! same source has been delivered. A slow frame of one source holds back only that source.
//!
//! Bound: a frame counts against `max_in_flight` from admission until it is delivered, so
//! frames finished behind a slow one of their source take places too, and the executor never
//! holds more than `max_in_flight` frames. So that a slow source cannot take them all, one
//! source may hold at most `max_in_flight` minus one place per other open source (at least one).
//! By default there are two places per worker (`config::IN_FLIGHT_PER_WORKER`): with one, a
//! worker that finished a frame before an earlier one would idle until that frame's delivery.
//!
//! Reset: a stateful step that panics may leave its state for the frame's source half updated;
//! that state is dropped (`Step::reset_source`) on the thread that caught the panic, before the
//! node's gate passes to the source's next frame, so no later frame sees it. It is counted
//! (`step_state_resets`) and logged; other sources keep theirs.
//!
//! Resize: when a source's frames change size (a camera back at another size), each stateful
//! step is told (`Step::source_resized`) just before its first run on a frame of the new size,
//! under its gate, so between two frames of the source; it restarts what it keeps in pixels
//! (`gate.rs` remembers the size each node last ran on). Sinks see the new size themselves.
//!
//! Failure: a step that errs or panics fails its frame. Nodes of that frame that have not
//! started are skipped; nodes already running finish; the frame is delivered once every node
//! has finished or been skipped, with the first failure recorded. Whatever unwinds while a node
//! runs (a step's panic, or one outside the step: its panic payload's drop, its inputs' or
//! outputs' drop) is caught around the node, which then finishes as failed: the frame's
//! remaining count and the node's gate always move on.
//!
//! Pool (`pool_source.rs`): the host's, never built or shut down here, or the executor's own,
//! built at the first dispatch and shut down once.

mod claims;
mod gate;
mod pool_source;
mod reorder;
mod run;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Select, Sender};

use super::graph::Graph;
use super::pool::{PoolError, PoolHandle, PoolMetrics};
use crate::config::{ExecutorConfig, OnStepError};
use crate::frame::Frame;
use crate::outcome::{FrameResult, StepFailure};
use crate::throttle::Throttle;
use gate::Gates;
use pool_source::PoolSource;
use reorder::Lanes;
use run::Run;

/// Counts of one [`Executor::run`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunStats {
    /// Frames taken into the workflow.
    pub admitted: u64,
    /// Frames delivered with every step done or skipped, none failed.
    pub processed: u64,
    /// Frames delivered with a failed step.
    pub failed: u64,
    /// Set when `on_step_error = "stop"` ended the run.
    pub stopped_by: Option<StepFailure>,
}

/// Runs the DAG on frames. With a pool from its host ([`Executor::new`]) it never builds or
/// shuts down a pool; without one ([`Executor::owning`]) it builds its own at the first
/// dispatch and shuts it down exactly once, in [`Executor::close`] or on drop.
#[derive(Debug)]
pub struct Executor {
    shared: Arc<Shared>,
    config: ExecutorConfig,
    /// Per-source numbering, gates and delivery order; the coordinator's alone.
    lanes: Lanes<Gates<Arc<Run>>, Arc<Run>>,
}

/// Counters of the executor itself (the pool counts its own). Written with relaxed ordering by
/// the coordinator (`coordinator_wakeups`), the thread that builds the own pool
/// (`pools_built`) and any thread running a node (`step_panics`, `step_state_resets`); read for
/// statistics only.
#[derive(Debug, Default)]
pub struct ExecutorMetrics {
    /// Times the coordinator woke up (a frame, a finished frame, or an abort arrived).
    pub coordinator_wakeups: AtomicU64,
    /// Pools this executor built for itself (0 with a host's pool, at most 1 otherwise).
    pub pools_built: AtomicU64,
    /// Panics caught while running nodes, in a step or around it (each failed its frame).
    /// The pool never sees them.
    pub step_panics: AtomicU64,
    /// Times a stateful step's state for one source was dropped because the step panicked on a
    /// frame of that source (the state may have been half updated).
    pub step_state_resets: AtomicU64,
    /// Frames admitted and not yet delivered; stored by the coordinator after each change.
    pub in_flight: AtomicU64,
    /// Per node of the graph, in graph order: bumped by the thread that ran the step.
    pub steps: Box<[StepMetrics]>,
}

/// Upper bounds (seconds) of the step latency histogram's buckets; the last bucket is +Inf.
pub const LATENCY_BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// One step's counters (relaxed: statistics). A step is counted when it runs, not when it is
/// skipped (a branch not taken, `every_n_frames`, a failed frame).
#[derive(Debug)]
pub struct StepMetrics {
    pub name: Arc<str>,
    pub runs: AtomicU64,
    /// Runs that failed (an error, a panic, the wrong number of outputs).
    pub failures: AtomicU64,
    /// Panics after which the step's state for a source was reset.
    pub state_resets: AtomicU64,
    /// Runs per latency bucket (not cumulative): `LATENCY_BUCKETS_S`, then +Inf.
    pub buckets: [AtomicU64; LATENCY_BUCKETS_S.len() + 1],
    /// Total time in the step, in microseconds.
    pub total_us: AtomicU64,
}

impl StepMetrics {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            runs: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            state_resets: AtomicU64::new(0),
            buckets: Default::default(),
            total_us: AtomicU64::new(0),
        }
    }

    /// Counts one run that took `took`.
    fn record(&self, took: std::time::Duration, failed: bool) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS_S
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.total_us.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// A frame whose steps take longer than this on average (measured so far) never runs on the
/// coordinator: that long without admitting or delivering would idle a worker that finishes
/// meanwhile (a detector's frame, milliseconds, would hold the next frame back from a free
/// worker). Cheaper frames do, to spare a worker's wake-up, which costs some microseconds.
const COORDINATOR_FRAME_MAX_US: u64 = 200;

impl ExecutorMetrics {
    /// Whether the steps of a frame took under [`COORDINATOR_FRAME_MAX_US`] on average so far
    /// (the sum of each step's mean run; a step not run yet counts nothing).
    fn frame_is_cheap(&self) -> bool {
        let mean_us: u64 = self
            .steps
            .iter()
            .map(|m| {
                let runs = m.runs.load(Ordering::Relaxed);
                m.total_us
                    .load(Ordering::Relaxed)
                    .checked_div(runs)
                    .unwrap_or(0)
            })
            .sum();
        mean_us < COORDINATOR_FRAME_MAX_US
    }

    fn for_graph(graph: &Graph) -> Self {
        Self {
            steps: graph
                .nodes
                .iter()
                .map(|n| StepMetrics::new(n.name.clone()))
                .collect(),
            ..Self::default()
        }
    }
}

/// What the threads running a frame's nodes share; read-only once the first frame runs.
#[derive(Debug)]
struct Shared {
    graph: Arc<Graph>,
    pool: PoolSource,
    /// Whether a worker runs one ready successor itself instead of queueing it.
    inline: bool,
    /// Whether the coordinator runs the first steps of a frame that arrives to an idle
    /// workflow, instead of waking a worker for them.
    coordinator_runs_steps: bool,
    metrics: Arc<ExecutorMetrics>,
    /// Step failures as logged: the first of each step and message, then a count every
    /// [`crate::throttle::INTERVAL`] (the frames' records count every one).
    failures_said: Throttle,
}

impl Executor {
    /// An executor on the host's pool.
    pub fn new(graph: Arc<Graph>, pool: PoolHandle, config: ExecutorConfig) -> Self {
        Self::with_pool(graph, PoolSource::Host(pool), config)
    }

    /// An executor that builds its own pool of `config.workers` threads when it first needs
    /// one, for one-shot use without a host.
    pub fn owning(graph: Arc<Graph>, config: ExecutorConfig) -> Self {
        let pool = PoolSource::own(config.workers);
        Self::with_pool(graph, pool, config)
    }

    fn with_pool(graph: Arc<Graph>, pool: PoolSource, config: ExecutorConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                pool,
                inline: true,
                coordinator_runs_steps: true,
                metrics: Arc::new(ExecutorMetrics::for_graph(&graph)),
                failures_said: Throttle::default(),
                graph,
            }),
            config,
            lanes: Lanes::default(),
        }
    }

    /// Turns inline continuation off (every ready step goes through the pool's queue), to
    /// measure what it saves. Only before the first frame.
    pub fn without_inline_continuation(mut self) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.inline = false;
        }
        self
    }

    /// Makes the coordinator hand every step to the pool, to measure what running the first
    /// steps of an idle workflow's frame itself saves. Only before the first frame.
    pub fn without_coordinator_steps(mut self) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.coordinator_runs_steps = false;
        }
        self
    }

    /// The executor's counters; the `Arc` may be kept to read them while `run` has the
    /// executor.
    pub fn metrics(&self) -> &Arc<ExecutorMetrics> {
        &self.shared.metrics
    }

    /// The counters of the pool in use: the host's, or the executor's own once built.
    pub fn pool_metrics(&self) -> Option<Arc<PoolMetrics>> {
        self.shared.pool.metrics()
    }

    /// Shuts down the executor's own pool, if it built one; a host's pool is left alone.
    pub fn close(self) -> Result<(), PoolError> {
        self.shared.pool.shutdown_own()
    }

    pub fn graph(&self) -> &Arc<Graph> {
        &self.shared.graph
    }

    /// Takes frames until `frames` closes, `abort` fires, or (with `on_step_error = "stop"`) a
    /// frame fails; then drains every admitted frame. Results reach `deliver` in frame order
    /// (per source, if the channel carries several).
    pub fn run(
        &mut self,
        frames: &Receiver<Frame>,
        abort: &Receiver<()>,
        deliver: impl FnMut(FrameResult),
    ) -> RunStats {
        self.run_sources(std::slice::from_ref(frames), abort, deliver)
    }

    /// Like [`Executor::run`], taking frames from several sources, each with its own channel;
    /// it ends when every one of them has closed (or on abort or stop). The results of one
    /// source reach `deliver` in that source's order; sources do not wait for each other.
    pub fn run_sources(
        &mut self,
        sources: &[Receiver<Frame>],
        abort: &Receiver<()>,
        mut deliver: impl FnMut(FrameResult),
    ) -> RunStats {
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Arc<Run>>();
        let mut abort = abort.clone();
        let mut stats = RunStats::default();
        // Frames admitted and not yet delivered (running, or finished and waiting for an
        // earlier frame of their source): at most `max_in_flight`.
        let mut in_flight = 0usize;
        // The same, per frame channel.
        let mut held = vec![0usize; sources.len()];
        // Frame channels still open.
        let mut open: Vec<usize> = (0..sources.len()).collect();
        let mut admitting = true;
        let on_step_error = self.config.on_step_error;
        let max_in_flight = self.config.max_in_flight;
        loop {
            // A source may hold all the places but one per other open source: a frame that is
            // slow in one source (its later frames waiting behind it) never shuts another out.
            let share = max_in_flight
                .saturating_sub(open.len().saturating_sub(1))
                .max(1);
            let takes: Vec<usize> = if admitting && in_flight < max_in_flight {
                open.iter().copied().filter(|&s| held[s] < share).collect()
            } else {
                Vec::new()
            };
            let finished = if !takes.is_empty() || (admitting && !open.is_empty() && in_flight > 0)
            {
                let mut select = Select::new();
                for &s in &takes {
                    select.recv(&sources[s]);
                }
                let done_at = select.recv(&done_rx);
                let abort_at = select.recv(&abort);
                let op = select.select();
                match op.index() {
                    i if i == done_at => op.recv(&done_rx).ok(),
                    i if i == abort_at => {
                        match op.recv(&abort) {
                            Ok(()) => admitting = false,
                            // Nobody can abort any more: stop listening.
                            Err(_) => abort = crossbeam_channel::never(),
                        }
                        None
                    }
                    i => {
                        let s = takes[i];
                        match op.recv(&sources[s]) {
                            Ok(frame) => {
                                // The frame's first steps run right here when the coordinator
                                // would only wait for them: the frame is alone with nothing
                                // queued behind it, or it takes the last free place in the
                                // workflow. No worker has to be woken for them. Only while one
                                // source is open: with several, time spent in a step here is
                                // time another source's frame or result waits.
                                let run_here = self.shared.coordinator_runs_steps
                                    && open.len() == 1
                                    && (in_flight + 1 == max_in_flight
                                        || (in_flight == 0 && sources[s].is_empty()))
                                    && self.shared.metrics.frame_is_cheap();
                                self.admit(frame, s, &done_tx, run_here);
                                in_flight += 1;
                                held[s] += 1;
                                stats.admitted += 1;
                            }
                            Err(_) => open.retain(|&o| o != s),
                        }
                        None
                    }
                }
            } else if in_flight > 0 {
                done_rx.recv().ok()
            } else {
                break;
            };
            self.shared
                .metrics
                .coordinator_wakeups
                .fetch_add(1, Ordering::Relaxed);
            let Some(run) = finished else {
                self.shared
                    .metrics
                    .in_flight
                    .store(in_flight as u64, Ordering::Relaxed);
                continue;
            };
            let (lane, index) = (run.lane, run.index);
            self.lanes.finished(lane, index, run, |run| {
                in_flight -= 1;
                held[run.origin] -= 1;
                let result = FrameResult::new(run.record.clone());
                match result.failure() {
                    None => stats.processed += 1,
                    Some(failure) => {
                        stats.failed += 1;
                        if on_step_error == OnStepError::Stop && stats.stopped_by.is_none() {
                            tracing::error!(step = %failure.step, "stopping on step error");
                            stats.stopped_by = Some(failure);
                            admitting = false;
                        }
                    }
                }
                deliver(result);
            });
            self.shared
                .metrics
                .in_flight
                .store(in_flight as u64, Ordering::Relaxed);
        }
        run::say_unsaid_failures(&self.shared.failures_said);
        stats
    }

    /// Runs one frame through the workflow and waits for its result.
    pub fn process(&mut self, frame: Frame) -> FrameResult {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let never = crossbeam_channel::never();
        let mut out = None;
        // The sender is dropped right after the frame is queued: `run` returns once it is done.
        let _ = tx.send(frame);
        drop(tx);
        self.run(&rx, &never, |r| out = Some(r));
        match out {
            Some(r) => r,
            None => unreachable_result(),
        }
    }

    /// Numbers `frame` (from frame channel `origin`) in its source's lane and starts it.
    fn admit(&mut self, frame: Frame, origin: usize, done: &Sender<Arc<Run>>, run_here: bool) {
        let graph = &self.shared.graph;
        let (lane, index, gates) = self.lanes.admit(&frame.source, || Gates::new(graph));
        run::start(
            &self.shared,
            (lane, index, origin),
            gates,
            frame,
            done,
            run_here,
        );
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Err(e) = self.shared.pool.shutdown_own() {
            tracing::error!(error = %e, "executor's own pool");
        }
    }
}

#[expect(
    clippy::panic,
    reason = "run() delivers every admitted frame before returning"
)]
fn unreachable_result() -> FrameResult {
    panic!("executor returned without delivering the frame it was given")
}
