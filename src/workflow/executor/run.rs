//! One frame inside the workflow: its countdowns, running a node, finishing it.
//!
//! A `Run` is shared (`Arc`) by every thread that runs one of the frame's nodes: the
//! coordinator for the first ones, workers for the rest, and the gates of its lane while one of
//! its nodes waits for its turn. Who writes what:
//! - `pending[node]`: decremented (AcqRel) once by each predecessor as it finishes; the thread
//!   that brings it to zero (or the coordinator, for a root) takes the node to run;
//! - the record: a node's outcome is set once, by the thread that ran it, before the node's
//!   successors are counted down (so they see it); the first failure is kept;
//! - `remaining`: decremented (AcqRel) once per node when it finishes, whatever happened in it;
//!   the thread that brings it to zero sends the run back to the coordinator over `done`.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_channel::Sender;

use super::Shared;
use super::claims::{self, Frames, Ready};
use super::gate::Gates;
use crate::frame::{Format, Frame};
use crate::outcome::{FrameRecord, Outcome, StepFailure};
use crate::spec::Ref;
use crate::steps::{StepError, StepInput, StepOutput};
use crate::throttle::{self, Say, Throttle};
use crate::value::{Image, Value};
use crate::workflow::graph::Node;

/// One frame inside the workflow.
#[derive(Debug)]
pub(super) struct Run {
    /// Position of the frame among the admitted frames of its source.
    pub(super) index: u64,
    /// The source's lane (coordinator numbering).
    pub(super) lane: usize,
    /// Which of the coordinator's frame channels the frame came from.
    pub(super) origin: usize,
    /// The gates of the frame's source.
    gates: Arc<Gates<Arc<Run>>>,
    pub(super) shared: Arc<Shared>,
    pub(super) record: Arc<FrameRecord>,
    /// Unfinished predecessors per node; the thread that brings one to zero queues the node.
    pending: Box<[AtomicUsize]>,
    /// Nodes not finished; the thread that brings it to zero delivers the frame.
    remaining: AtomicUsize,
    done: Sender<Arc<Run>>,
}

impl Frames for Run {
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn run_from(self: &Arc<Self>, node: usize) {
        run_from(self, node);
    }
}

/// Starts frame `index` of `lane`: its roots run here (`run_here`, chain included) or go to
/// the pool.
pub(super) fn start(
    shared: &Arc<Shared>,
    (lane, index, origin): (usize, u64, usize),
    gates: Arc<Gates<Arc<Run>>>,
    frame: Frame,
    done: &Sender<Arc<Run>>,
    run_here: bool,
) {
    let graph = &shared.graph;
    let run = Arc::new(Run {
        index,
        lane,
        origin,
        gates,
        shared: shared.clone(),
        record: Arc::new(FrameRecord::new(Arc::new(frame), graph.len())),
        pending: graph
            .nodes
            .iter()
            .map(|n| AtomicUsize::new(n.predecessors))
            .collect(),
        remaining: AtomicUsize::new(graph.len()),
        done: done.clone(),
    });
    if graph.is_empty() {
        let _ = run.done.send(run.clone());
        return;
    }
    let mut ready = Ready::default();
    for &root in &graph.roots {
        if admit(&run, root) {
            ready.push(root);
        }
    }
    if run_here {
        if let Some(root) = claims::spread(&run, ready) {
            run_from(&run, root);
        }
    } else {
        claims::hand_out(&run, ready);
    }
}

/// Whether `node` may run now for `run`; if not, its gate keeps the run until its turn.
fn admit(run: &Arc<Run>, node: usize) -> bool {
    run.gates.enter(node, run.index, || run.clone())
}

/// Runs `node`, then keeps running one newly ready successor on this thread. Whatever unwinds
/// while a node runs is caught here: the node is recorded as failed and still finishes, so
/// the frame is delivered and the node's gate passes to the next frame.
pub(super) fn run_from(run: &Arc<Run>, mut node: usize) {
    loop {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| execute(run, node))) {
            run.shared
                .metrics
                .step_panics
                .fetch_add(1, Ordering::Relaxed);
            let message = format!("panicked outside the step: {}", panic_message(&*payload));
            drop_payload(payload);
            let name = &run.shared.graph.nodes[node].name;
            let outcome = fail(run, name, message);
            // Kept only if the node had no outcome yet.
            run.record.set_outcome(node, outcome);
        }
        match finish(run, node) {
            Some(next) => node = next,
            None => return,
        }
    }
}

fn execute(run: &Run, node: usize) {
    let n = &run.shared.graph.nodes[node];
    let outcome =
        if run.record.failure().is_some() || !run.record.frame().seq.is_multiple_of(n.every) {
            Outcome::Skipped
        } else {
            match inputs(run, n) {
                None => Outcome::Skipped,
                Some(values) => {
                    let input = StepInput {
                        frame: run.record.frame(),
                        values: &values,
                    };
                    let frame = input.frame;
                    let resized = run.gates.ran_on(node, frame.format());
                    let started = Instant::now();
                    let result = match catch_unwind(AssertUnwindSafe(|| {
                        if let Some(from) = resized {
                            tell_resized(n, &frame.source, from, frame.format());
                        }
                        n.step.run(&input)
                    })) {
                        Ok(result) => result,
                        Err(payload) => {
                            run.shared
                                .metrics
                                .step_panics
                                .fetch_add(1, Ordering::Relaxed);
                            if n.kind.stateful {
                                reset_after_panic(run, n, node);
                            }
                            // The payload is dropped at the end of this arm, outside the step's
                            // catch: if that panics too, `run_from` catches it.
                            Err(StepError::Panic(panic_message(&*payload)))
                        }
                    };
                    let failed = match &result {
                        Ok(StepOutput::Values(values)) => values.len() != n.kind.outputs.len(),
                        Ok(StepOutput::EndBranch) => false,
                        Err(_) => true,
                    };
                    if let Some(m) = run.shared.metrics.steps.get(node) {
                        m.record(started.elapsed(), failed);
                    }
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
    // Each node is executed once per frame, so the outcome is always recorded here.
    run.record.set_outcome(node, outcome);
}

/// After stateful node `n` panicked on this frame: its state for the frame's source may be
/// half updated, so it is dropped (the source's next frame starts afresh), counted and logged.
/// This runs while the frame still holds the node's gate: no later frame of the source has
/// seen the state.
fn reset_after_panic(run: &Run, n: &Node, node: usize) {
    let source = &run.record.frame().source;
    let what = if n.step.reset_source(source) {
        let metrics = &run.shared.metrics;
        metrics.step_state_resets.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = metrics.steps.get(node) {
            m.state_resets.fetch_add(1, Ordering::Relaxed);
        }
        "its state for that source was reset"
    } else {
        "it cannot reset its state and keeps it"
    };
    tracing::warn!(
        step = %n.name,
        source = %source,
        "step \"{}\" panicked on source \"{}\"; {what}",
        n.name,
        source
    );
}

/// Tells stateful node `n` that its source's frames went from `from` to `to`, and logs what
/// that means for the step, if anything.
fn tell_resized(n: &Node, source: &str, from: Format, to: Format) {
    if let Some(what) = n.step.source_resized(source, from, to) {
        tracing::warn!(
            step = %n.name,
            source,
            "step \"{}\": source \"{source}\" went from {from} to {to}; {what}",
            n.name
        );
    }
}

/// The node's input values, or `None` when a required one was not produced on this frame (an
/// optional one that was not is passed as `None`).
fn inputs(run: &Run, n: &Node) -> Option<Vec<Option<Value>>> {
    n.inputs
        .iter()
        .zip(n.kind.inputs)
        .map(|(r, port)| {
            let value = match *r {
                None => None,
                Some(Ref::Frame) => Some(Value::Image(Image::Frame(run.record.frame().clone()))),
                Some(Ref::Step { step, output }) => match run.record.outcome(step)? {
                    Outcome::Done(values) => values.get(output).cloned(),
                    Outcome::Skipped | Outcome::Failed => None,
                },
            };
            match value {
                None if !port.optional => None,
                value => Some(value),
            }
        })
        .collect()
}

fn fail(run: &Run, step: &Arc<str>, message: String) -> Outcome {
    let frame = run.record.frame();
    match run.shared.failures_said.hit(step, &message) {
        Say::First => tracing::warn!(
            step = %step,
            source = %frame.source,
            frame = frame.seq,
            error = %message,
            "step failed; frame skipped (the same failure again is counted, and said every {} s)",
            throttle::INTERVAL.as_secs()
        ),
        Say::Again { more, over } => say_more(step, more, over, &message),
        Say::Counted => {}
    }
    run.record.set_failure(StepFailure {
        step: step.clone(),
        message,
    });
    Outcome::Failed
}

/// Says that `step` failed `more` more times in the last `over`, with `message`.
fn say_more(step: &str, more: u64, over: std::time::Duration, message: &str) {
    tracing::warn!(
        step = %step,
        frames = more,
        "step \"{step}\" failed on {more} more frame(s) in the last {:.1} s: {message}",
        over.as_secs_f64()
    );
}

/// Says the step failures counted and not said yet (at the end of a run).
pub(super) fn say_unsaid_failures(said: &Throttle) {
    for u in said.drain() {
        say_more(&u.what, u.more, u.over, &u.cause);
    }
}

/// Marks `node` finished: counts down its successors, passes its gate to the next frame of the
/// source, delivers the frame if this was its last node, then queues what became ready
/// (returning one node for this thread to run). Every count is settled before any job is
/// queued.
fn finish(run: &Arc<Run>, node: usize) -> Option<usize> {
    let mut ready = Ready::default();
    for &succ in &run.shared.graph.nodes[node].successors {
        if run.pending[succ].fetch_sub(1, Ordering::AcqRel) == 1 && admit(run, succ) {
            ready.push(succ);
        }
    }
    let next_at_gate = run.gates.leave(node, run.index);
    if run.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        // The coordinator outlives every frame it admitted, so this send cannot fail.
        let _ = run.done.send(run.clone());
    }
    if let Some(next) = next_at_gate {
        claims::dispatch(next, node);
    }
    claims::spread(run, ready)
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    crate::spec::panic_text(panic).unwrap_or_else(|| "unknown panic".to_owned())
}

/// Drops a caught panic's payload; one whose drop panics again is leaked, not unwound.
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}
