//! What a frame carries once the workflow is done with it: the outcome of every step and the
//! first failure. The executor fills a [`FrameRecord`] step by step and hands it on as a
//! [`FrameResult`]; sinks and the daemon only read it.
//!
//! A bottom-layer module: it knows frames, values and references, nothing of how steps are run.
//! Sharing: one record per frame, written by whichever threads run the frame's steps (each
//! step's outcome is set once, the first failure is kept), and read only after its last step has
//! finished (the executor delivers the frame through a channel, which orders those writes before
//! every read).

use std::sync::{Arc, OnceLock};

use crate::frame::Frame;
use crate::spec::Ref;
use crate::value::{Image, Value};

/// What became of one step for one frame.
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

/// The outcomes of one frame's steps as they are recorded.
#[derive(Debug)]
pub struct FrameRecord {
    frame: Arc<Frame>,
    /// One per step, in graph order; each set once.
    outcomes: Box<[OnceLock<Outcome>]>,
    /// The first failure; later ones are logged by the executor, not kept.
    failure: OnceLock<StepFailure>,
}

impl FrameRecord {
    /// An empty record for a workflow of `steps` steps.
    pub fn new(frame: Arc<Frame>, steps: usize) -> Self {
        Self {
            frame,
            outcomes: (0..steps).map(|_| OnceLock::new()).collect(),
            failure: OnceLock::new(),
        }
    }

    pub fn frame(&self) -> &Arc<Frame> {
        &self.frame
    }

    /// Records what became of step `step`. Returns false (and keeps the first) if it already
    /// had an outcome, or if there is no such step.
    pub fn set_outcome(&self, step: usize, outcome: Outcome) -> bool {
        self.outcomes
            .get(step)
            .is_some_and(|slot| slot.set(outcome).is_ok())
    }

    pub fn outcome(&self, step: usize) -> Option<&Outcome> {
        self.outcomes.get(step)?.get()
    }

    /// Records a failure; only the first one is kept (returns whether this one was).
    pub fn set_failure(&self, failure: StepFailure) -> bool {
        self.failure.set(failure).is_ok()
    }

    pub fn failure(&self) -> Option<&StepFailure> {
        self.failure.get()
    }

    /// The value a reference points to, if its step ran.
    pub fn value(&self, r: Ref) -> Option<Value> {
        match r {
            Ref::Frame => Some(Value::Image(Image::Frame(self.frame.clone()))),
            Ref::Step { step, output } => match self.outcome(step)? {
                Outcome::Done(values) => values.get(output).cloned(),
                Outcome::Skipped | Outcome::Failed => None,
            },
        }
    }
}

/// One frame after the workflow: cheap to clone (one per sink).
#[derive(Debug, Clone)]
pub struct FrameResult {
    record: Arc<FrameRecord>,
}

impl FrameResult {
    /// The result of a record whose every step has its outcome.
    pub fn new(record: Arc<FrameRecord>) -> Self {
        Self { record }
    }

    pub fn frame(&self) -> &Arc<Frame> {
        self.record.frame()
    }

    /// The value a reference points to, if its step ran.
    pub fn value(&self, r: Ref) -> Option<Value> {
        self.record.value(r)
    }

    pub fn outcome(&self, step: usize) -> Option<&Outcome> {
        self.record.outcome(step)
    }

    pub fn failure(&self) -> Option<StepFailure> {
        self.record.failure().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> FrameRecord {
        FrameRecord::new(
            Arc::new(Frame::from_mat("cam".into(), 0, None, Default::default())),
            2,
        )
    }

    #[test]
    fn an_outcome_is_set_once_and_the_first_failure_is_kept() {
        let r = record();
        assert!(r.set_outcome(0, Outcome::Skipped));
        assert!(!r.set_outcome(0, Outcome::Failed));
        assert!(matches!(r.outcome(0), Some(Outcome::Skipped)));
        assert!(!r.set_outcome(2, Outcome::Skipped), "no third step");
        let failure = |step: &str| StepFailure {
            step: step.into(),
            message: "bad".to_owned(),
        };
        assert!(r.set_failure(failure("a")));
        assert!(!r.set_failure(failure("b")));
        assert_eq!(r.failure().map(|f| f.step.as_ref()), Some("a"));
    }

    #[test]
    fn a_reference_to_a_step_that_did_not_run_has_no_value() {
        let r = record();
        r.set_outcome(
            0,
            Outcome::Done(vec![Value::Detections(Arc::from(Vec::new()))]),
        );
        r.set_outcome(1, Outcome::Failed);
        let result = FrameResult::new(Arc::new(r));
        assert!(result.value(Ref::Step { step: 0, output: 0 }).is_some());
        assert!(result.value(Ref::Step { step: 0, output: 1 }).is_none());
        assert!(result.value(Ref::Step { step: 1, output: 0 }).is_none());
        assert!(result.value(Ref::Frame).is_some());
    }
}
