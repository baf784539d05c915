//! Runs the workflow DAG on every frame, on one persistent pool.
//!
//! Threads: the coordinator is the thread that calls [`Executor::run`]; it blocks in one select
//! over: the frame channel of each source (each bounded by its source's `queue`), finished
//! frames from the workers (`done`, unbounded but never holding more than `max_in_flight`
//! entries, since a frame is only admitted when fewer than that are in flight) and an abort
//! channel. Steps run on the pool's workers.
//!
//! Scheduling: each frame gets a [`Run`] with an atomic count of unfinished predecessors per
//! node. A node is queued exactly once, by whoever brings that count to zero (the coordinator
//! for root nodes); a worker that finishes a node runs one newly ready successor itself and
//! queues the others; when three or more become ready together, at most one pool job per worker
//! is queued and those jobs and this thread claim the ready nodes one by one, so a wide fan-out
//! does not cost a job per node. A frame that arrives while no other frame is in flight and
//! none waits behind it (a live source between frames), or that takes the last free place in
//! the workflow, has its first root run by the coordinator itself, chain included: no worker is
//! woken for work the coordinator could only wait for. A stateful node (see
//! `StepKind::stateful`) also waits for its turn at a per-node gate, so it sees frames strictly
//! in admission order; stateless nodes of different frames run concurrently. When a node's last
//! pending count drops the frame is complete and goes back to the coordinator, which delivers
//! results in frame order.
//!
//! Failure: a step that errs or panics fails its frame. Nodes of that frame that have not
//! started are skipped; nodes already running finish; the frame is delivered once every node
//! has finished or been skipped, with the first failure recorded.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crossbeam_channel::{Receiver, Select, Sender};

use super::graph::Graph;
use super::pool::{Pool, PoolError, PoolHandle, PoolMetrics};
use crate::config::{ExecutorConfig, OnStepError};
use crate::frame::Frame;
use crate::spec::Ref;
use crate::steps::{StepError, StepInput, StepOutput};
use crate::value::{Image, Value};

/// What became of one node for one frame.
#[derive(Debug, Clone)]
pub enum Outcome {
    Done(Vec<Value>),
    /// Not run: the frame failed first, or an input was missing.
    Skipped,
    Failed,
}

/// The step that failed a frame, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    pub step: Arc<str>,
    pub message: String,
}

/// One frame after the workflow.
#[derive(Debug, Clone)]
pub struct FrameResult {
    run: Arc<Run>,
}

impl FrameResult {
    pub fn frame(&self) -> &Arc<Frame> {
        &self.run.frame
    }

    /// The value a reference points to, if its step ran.
    pub fn value(&self, r: Ref) -> Option<Value> {
        match r {
            Ref::Frame => Some(Value::Image(Image::Frame(self.run.frame.clone()))),
            Ref::Step { step, output } => match self.run.slots.get(step)?.get()? {
                Outcome::Done(values) => values.get(output).cloned(),
                Outcome::Skipped | Outcome::Failed => None,
            },
        }
    }

    pub fn outcome(&self, node: usize) -> Option<&Outcome> {
        self.run.slots.get(node)?.get()
    }

    pub fn failure(&self) -> Option<StepFailure> {
        self.run
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

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
}

/// Counters of the executor itself (the pool counts its own).
#[derive(Debug, Default)]
pub struct ExecutorMetrics {
    /// Times the coordinator woke up (a frame, a finished frame, or an abort arrived).
    pub coordinator_wakeups: AtomicU64,
    /// Pools this executor built for itself (0 with a host's pool, at most 1 otherwise).
    pub pools_built: AtomicU64,
}

/// Where the executor's jobs go.
#[derive(Debug)]
enum PoolSource {
    /// The host's pool: used, never built or shut down here.
    Host(PoolHandle),
    /// Built at the first dispatch, shut down once by `close` (or on drop).
    Own {
        size: usize,
        handle: OnceLock<Option<PoolHandle>>,
        pool: Mutex<Option<Pool>>,
    },
}

#[derive(Debug)]
struct Shared {
    graph: Arc<Graph>,
    pool: PoolSource,
    /// Whether a worker runs one ready successor itself instead of queueing it.
    inline: bool,
    /// Whether the coordinator runs the first steps of a frame that arrives to an idle
    /// workflow, instead of waking a worker for them.
    coordinator_runs_steps: bool,
    metrics: ExecutorMetrics,
    /// One gate per stateful node.
    gates: Box<[Option<Gate>]>,
    /// Index of the next admitted frame; written only by the coordinator.
    next_index: AtomicU64,
}

/// Lets a stateful node run for frames one at a time, in admission order.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// The frame whose turn it is.
    next: u64,
    /// Frames whose inputs are ready but whose turn has not come.
    waiting: BTreeMap<u64, Arc<Run>>,
}

/// One frame inside the workflow.
#[derive(Debug)]
struct Run {
    index: u64,
    frame: Arc<Frame>,
    shared: Arc<Shared>,
    slots: Box<[OnceLock<Outcome>]>,
    /// Unfinished predecessors per node; the thread that brings one to zero queues the node.
    pending: Box<[AtomicUsize]>,
    /// Nodes not finished; the thread that brings it to zero delivers the frame.
    remaining: AtomicUsize,
    failed: AtomicBool,
    failure: Mutex<Option<StepFailure>>,
    done: Sender<FrameResult>,
}

impl Executor {
    /// An executor on the host's pool.
    pub fn new(graph: Arc<Graph>, pool: PoolHandle, config: ExecutorConfig) -> Self {
        Self::with_pool(graph, PoolSource::Host(pool), config)
    }

    /// An executor that builds its own pool of `config.workers` threads when it first needs
    /// one, for one-shot use without a host.
    pub fn owning(graph: Arc<Graph>, config: ExecutorConfig) -> Self {
        let pool = PoolSource::Own {
            size: config.workers,
            handle: OnceLock::new(),
            pool: Mutex::new(None),
        };
        Self::with_pool(graph, pool, config)
    }

    fn with_pool(graph: Arc<Graph>, pool: PoolSource, config: ExecutorConfig) -> Self {
        let gates = graph
            .nodes
            .iter()
            .map(|n| n.kind.stateful.then(Gate::default))
            .collect();
        Self {
            shared: Arc::new(Shared {
                graph,
                pool,
                inline: true,
                coordinator_runs_steps: true,
                metrics: ExecutorMetrics::default(),
                gates,
                next_index: AtomicU64::new(0),
            }),
            config,
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

    pub fn metrics(&self) -> &ExecutorMetrics {
        &self.shared.metrics
    }

    /// The counters of the pool in use: the host's, or the executor's own once built.
    pub fn pool_metrics(&self) -> Option<Arc<PoolMetrics>> {
        match &self.shared.pool {
            PoolSource::Host(handle) => Some(handle.metrics().clone()),
            PoolSource::Own { handle, .. } => handle.get()?.as_ref().map(|h| h.metrics().clone()),
        }
    }

    /// Shuts down the executor's own pool, if it built one; a host's pool is left alone.
    pub fn close(self) -> Result<(), PoolError> {
        self.shared.shutdown_own_pool()
    }

    pub fn graph(&self) -> &Arc<Graph> {
        &self.shared.graph
    }

    /// Takes frames until `frames` closes, `abort` fires, or (with `on_step_error = "stop"`) a
    /// frame fails; then drains every admitted frame. Results reach `deliver` in frame order.
    pub fn run(
        &self,
        frames: &Receiver<Frame>,
        abort: &Receiver<()>,
        deliver: impl FnMut(FrameResult),
    ) -> RunStats {
        self.run_sources(std::slice::from_ref(frames), abort, deliver)
    }

    /// Like [`Executor::run`], taking frames from several sources, each with its own channel;
    /// it ends when every one of them has closed (or on abort or stop).
    pub fn run_sources(
        &self,
        sources: &[Receiver<Frame>],
        abort: &Receiver<()>,
        mut deliver: impl FnMut(FrameResult),
    ) -> RunStats {
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<FrameResult>();
        let mut abort = abort.clone();
        let mut stats = RunStats::default();
        let mut reorder: VecDeque<Option<FrameResult>> = VecDeque::new();
        let mut next_out = self.shared.next_index.load(Ordering::Relaxed);
        let mut in_flight = 0usize;
        // Sources whose channel is still open.
        let mut open: Vec<&Receiver<Frame>> = sources.iter().collect();
        let mut admitting = true;
        loop {
            let finished = if admitting && !open.is_empty() && in_flight < self.config.max_in_flight
            {
                let mut select = Select::new();
                for rx in &open {
                    select.recv(rx);
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
                        match op.recv(open[i]) {
                            Ok(frame) => {
                                // The frame's first steps run right here when the coordinator
                                // would only wait for them: the frame is alone with nothing
                                // queued behind it, or it takes the last free place in the
                                // workflow. No worker has to be woken for them.
                                let run_here = self.shared.coordinator_runs_steps
                                    && (in_flight + 1 == self.config.max_in_flight
                                        || (in_flight == 0 && open.iter().all(|rx| rx.is_empty())));
                                self.start(frame, &done_tx, run_here);
                                in_flight += 1;
                                stats.admitted += 1;
                            }
                            Err(_) => {
                                open.remove(i);
                            }
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
            let Some(result) = finished else {
                continue;
            };
            in_flight -= 1;
            let slot = usize::try_from(result.run.index - next_out).unwrap_or(usize::MAX);
            if reorder.len() <= slot {
                reorder.resize_with(slot + 1, || None);
            }
            reorder[slot] = Some(result);
            while let Some(Some(_)) = reorder.front() {
                let Some(Some(result)) = reorder.pop_front() else {
                    break;
                };
                next_out += 1;
                match result.failure() {
                    None => stats.processed += 1,
                    Some(failure) => {
                        stats.failed += 1;
                        if self.config.on_step_error == OnStepError::Stop
                            && stats.stopped_by.is_none()
                        {
                            tracing::error!(step = %failure.step, "stopping on step error");
                            stats.stopped_by = Some(failure);
                            admitting = false;
                        }
                    }
                }
                deliver(result);
            }
        }
        stats
    }

    /// Runs one frame through the workflow and waits for its result.
    pub fn process(&self, frame: Frame) -> FrameResult {
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

    fn start(&self, frame: Frame, done: &Sender<FrameResult>, run_here: bool) {
        let shared = &self.shared;
        let graph = &shared.graph;
        let index = shared.next_index.fetch_add(1, Ordering::Relaxed);
        let run = Arc::new(Run {
            index,
            frame: Arc::new(frame),
            shared: shared.clone(),
            slots: graph.nodes.iter().map(|_| OnceLock::new()).collect(),
            pending: graph
                .nodes
                .iter()
                .map(|n| AtomicUsize::new(n.predecessors))
                .collect(),
            remaining: AtomicUsize::new(graph.len()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            done: done.clone(),
        });
        if graph.is_empty() {
            let _ = run.done.send(FrameResult { run: run.clone() });
            return;
        }
        let mut ready = Ready::default();
        for &root in &graph.roots {
            if admit(&run, root) {
                ready.push(root);
            }
        }
        if run_here {
            if let Some(root) = spread(&run, ready) {
                run_from(&run, root);
            }
        } else {
            hand_out(&run, ready);
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Err(e) = self.shared.shutdown_own_pool() {
            tracing::error!(error = %e, "executor's own pool");
        }
    }
}

impl Shared {
    /// The pool to queue jobs on; builds the executor's own pool on first use. `None` only if
    /// its threads could not be started: jobs then run on the calling thread.
    fn pool(&self) -> Option<&PoolHandle> {
        match &self.pool {
            PoolSource::Host(handle) => Some(handle),
            PoolSource::Own { size, handle, pool } => handle
                .get_or_init(|| match Pool::new(*size) {
                    Ok(built) => {
                        self.metrics.pools_built.fetch_add(1, Ordering::Relaxed);
                        let h = built.handle();
                        *pool.lock().unwrap_or_else(PoisonError::into_inner) = Some(built);
                        Some(h)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start worker pool; running steps inline");
                        None
                    }
                })
                .as_ref(),
        }
    }

    /// Threads of the pool in use (or that will be, for an owned pool not built yet).
    fn pool_size(&self) -> usize {
        match &self.pool {
            PoolSource::Host(handle) => handle.size(),
            PoolSource::Own { size, .. } => *size,
        }
    }

    fn shutdown_own_pool(&self) -> Result<(), PoolError> {
        let PoolSource::Own { pool, .. } = &self.pool else {
            return Ok(());
        };
        let taken = pool.lock().unwrap_or_else(PoisonError::into_inner).take();
        taken.map_or(Ok(()), Pool::shutdown)
    }
}

#[expect(
    clippy::panic,
    reason = "run() delivers every admitted frame before returning"
)]
fn unreachable_result() -> FrameResult {
    panic!("executor returned without delivering the frame it was given")
}

/// Whether `node` may run now for `run`; if not, the gate keeps the run until its turn.
fn admit(run: &Arc<Run>, node: usize) -> bool {
    let Some(gate) = &run.shared.gates[node] else {
        return true;
    };
    let mut state = gate.state.lock().unwrap_or_else(PoisonError::into_inner);
    if state.next == run.index {
        true
    } else {
        state.waiting.insert(run.index, run.clone());
        false
    }
}

fn dispatch(run: Arc<Run>, node: usize) {
    let shared = run.shared.clone();
    match shared.pool() {
        Some(pool) => {
            pool.execute(Box::new(move || run_from(&run, node)));
        }
        None => run_from(&run, node),
    }
}

/// Runs `node`, then keeps running one newly ready successor on this thread.
fn run_from(run: &Arc<Run>, mut node: usize) {
    loop {
        execute(run, node);
        match finish(run, node) {
            Some(next) => node = next,
            None => return,
        }
    }
}

fn execute(run: &Run, node: usize) {
    let n = &run.shared.graph.nodes[node];
    let outcome = if run.failed.load(Ordering::Acquire) {
        Outcome::Skipped
    } else {
        match inputs(run, &n.inputs) {
            None => Outcome::Skipped,
            Some(values) => {
                let input = StepInput {
                    frame: &run.frame,
                    values: &values,
                };
                let result = catch_unwind(AssertUnwindSafe(|| n.step.run(&input)))
                    .unwrap_or_else(|panic| Err(StepError::Panic(panic_message(&*panic))));
                match result {
                    Ok(StepOutput::EndBranch) => Outcome::Skipped,
                    Ok(StepOutput::Values(values)) if values.len() == n.kind.outputs.len() => {
                        Outcome::Done(values)
                    }
                    Ok(StepOutput::Values(values)) => fail(
                        run,
                        &n.name,
                        format!(
                            "returned {} outputs, its kind declares {}",
                            values.len(),
                            n.kind.outputs.len()
                        ),
                    ),
                    Err(e) => fail(run, &n.name, e.to_string()),
                }
            }
        }
    };
    // Each node is executed exactly once per frame, so the slot is always empty here.
    let _ = run.slots[node].set(outcome);
}

fn inputs(run: &Run, refs: &[Ref]) -> Option<Vec<Value>> {
    refs.iter()
        .map(|r| match *r {
            Ref::Frame => Some(Value::Image(Image::Frame(run.frame.clone()))),
            Ref::Step { step, output } => match run.slots[step].get()? {
                Outcome::Done(values) => values.get(output).cloned(),
                Outcome::Skipped | Outcome::Failed => None,
            },
        })
        .collect()
}

fn fail(run: &Run, step: &Arc<str>, message: String) -> Outcome {
    tracing::warn!(
        step = %step,
        source = %run.frame.source,
        frame = run.frame.seq,
        error = %message,
        "step failed; frame skipped"
    );
    let mut failure = run.failure.lock().unwrap_or_else(PoisonError::into_inner);
    failure.get_or_insert_with(|| StepFailure {
        step: step.clone(),
        message,
    });
    run.failed.store(true, Ordering::Release);
    Outcome::Failed
}

/// Marks `node` finished: queues ready successors (returning one to run inline), hands the
/// gate to the next frame, and delivers the frame if this was its last node.
fn finish(run: &Arc<Run>, node: usize) -> Option<usize> {
    let shared = &run.shared;
    let mut ready = Ready::default();
    for &succ in &shared.graph.nodes[node].successors {
        if run.pending[succ].fetch_sub(1, Ordering::AcqRel) == 1 && admit(run, succ) {
            ready.push(succ);
        }
    }
    if let Some(gate) = &shared.gates[node] {
        let next = {
            let mut state = gate.state.lock().unwrap_or_else(PoisonError::into_inner);
            let next = run.index + 1;
            state.next = next;
            state.waiting.remove(&next)
        };
        if let Some(next) = next {
            dispatch(next, node);
        }
    }
    if run.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        // The coordinator outlives every frame it admitted, so this send cannot fail.
        let _ = run.done.send(FrameResult { run: run.clone() });
    }
    spread(run, ready)
}

/// Nodes of one frame that became ready together. Most nodes free one or two successors:
/// those are kept without allocating.
#[derive(Debug, Default)]
struct Ready {
    first: Option<usize>,
    second: Option<usize>,
    rest: Vec<usize>,
}

impl Ready {
    fn push(&mut self, node: usize) {
        if self.first.is_none() {
            self.first = Some(node);
        } else if self.second.is_none() {
            self.second = Some(node);
        } else {
            self.rest.push(node);
        }
    }

    fn into_vec(self) -> Vec<usize> {
        let mut all: Vec<usize> = self.first.into_iter().chain(self.second).collect();
        all.extend(self.rest);
        all
    }
}

/// Ready nodes shared by several threads, each claiming the next one until none is left: a
/// wide fan-out costs a few pool jobs (at most one per worker), not one job per node.
#[derive(Debug)]
struct Claims {
    run: Arc<Run>,
    nodes: Vec<usize>,
    next: AtomicUsize,
}

impl Claims {
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&node) = self.nodes.get(i) else {
                return;
            };
            run_from(&self.run, node);
        }
    }
}

/// Shares ready nodes out between this thread and the pool. Returns the node this thread
/// should run next, if it is not already working through a shared batch.
fn spread(run: &Arc<Run>, ready: Ready) -> Option<usize> {
    if !run.shared.inline {
        hand_out(run, ready);
        return None;
    }
    if ready.rest.is_empty() {
        if let Some(second) = ready.second {
            dispatch(run.clone(), second);
        }
        return ready.first;
    }
    let nodes = ready.into_vec();
    let helpers = (nodes.len() - 1).min(run.shared.pool_size());
    let claims = Arc::new(Claims {
        run: run.clone(),
        nodes,
        next: AtomicUsize::new(0),
    });
    for _ in 0..helpers {
        dispatch_claims(claims.clone());
    }
    claims.work();
    None
}

/// Gives every ready node to the pool (this thread keeps none).
fn hand_out(run: &Arc<Run>, ready: Ready) {
    if !run.shared.inline || ready.rest.is_empty() {
        for node in ready.into_vec() {
            dispatch(run.clone(), node);
        }
        return;
    }
    let nodes = ready.into_vec();
    let helpers = nodes.len().min(run.shared.pool_size());
    let claims = Arc::new(Claims {
        run: run.clone(),
        nodes,
        next: AtomicUsize::new(0),
    });
    for _ in 0..helpers {
        dispatch_claims(claims.clone());
    }
}

fn dispatch_claims(claims: Arc<Claims>) {
    let shared = claims.run.shared.clone();
    match shared.pool() {
        Some(pool) => {
            pool.execute(Box::new(move || claims.work()));
        }
        None => claims.work(),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}
