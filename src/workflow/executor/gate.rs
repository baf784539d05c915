//! Gates: a stateful node sees the frames of one source one at a time, in admission order.
//!
//! Each lane (source) has its own [`Gates`], one [`Gate`] per stateful node, so frames of
//! different sources never queue behind each other. A gate's lock is taken by the thread that
//! makes the node ready for a frame (`enter`) and by the thread that finishes it (`leave`), only
//! for the bookkeeping, never while a step runs. A frame that is ready before its turn is kept
//! in the gate (`waiting`) and handed back by `leave` to the thread finishing the frame before
//! it, which queues it: nobody waits on the lock for a turn. Each gate also keeps the format
//! of the last frame its node ran on (`ran_on`, checked by the frame whose turn it is just
//! before the step runs), so a step hears of its source's new size between two frames
//! (`Step::source_resized`), at its first run on the new size.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use super::super::graph::Graph;
use crate::frame::Format;

/// Lets one node run for frames one at a time, in order of their index in the lane.
pub(super) struct Gate<T> {
    state: Mutex<GateState<T>>,
    /// The format of the last frame the node ran on: taken only by the frame whose turn it
    /// is, while its step runs ([`Gate::ran_on`]), so never contended.
    seen: Mutex<Option<Format>>,
}

struct GateState<T> {
    /// The frame whose turn it is.
    next: u64,
    /// Frames whose inputs are ready but whose turn has not come.
    waiting: BTreeMap<u64, T>,
}

impl<T> Default for Gate<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(GateState {
                next: 0,
                waiting: BTreeMap::new(),
            }),
            seen: Mutex::new(None),
        }
    }
}

impl<T> Gate<T> {
    /// Whether frame `index` may run now; if not, `later()` is kept until its turn.
    pub(super) fn enter(&self, index: u64, later: impl FnOnce() -> T) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.next == index {
            true
        } else {
            state.waiting.insert(index, later());
            false
        }
    }

    /// Frame `index` is done with the node: the turn passes to the next frame, returned if it
    /// was already waiting (the caller queues it).
    pub(super) fn leave(&self, index: u64) -> Option<T> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let next = index + 1;
        state.next = next;
        state.waiting.remove(&next)
    }

    /// The node runs on a frame of `format`: the format it last ran on in this lane when that
    /// had another size (`None` on its first run, and while the size stays).
    pub(super) fn ran_on(&self, format: Format) -> Option<Format> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let before = seen.replace(format);
        before.filter(|b| !b.same_size(&format))
    }
}

impl<T> fmt::Debug for Gate<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Gate")
            .field("next", &state.next)
            .field("waiting", &state.waiting.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The gates of one lane: one per stateful node, none for the others.
#[derive(Debug)]
pub(super) struct Gates<T> {
    nodes: Box<[Option<Gate<T>>]>,
}

impl<T> Gates<T> {
    pub(super) fn new(graph: &Graph) -> Self {
        Self {
            nodes: graph
                .nodes
                .iter()
                .map(|n| n.kind.stateful.then(Gate::default))
                .collect(),
        }
    }

    /// Whether `node` may run now for frame `index` (always, if it has no gate).
    pub(super) fn enter(&self, node: usize, index: u64, later: impl FnOnce() -> T) -> bool {
        match self.nodes.get(node) {
            Some(Some(gate)) => gate.enter(index, later),
            _ => true,
        }
    }

    /// `node` runs on a frame of `format`: see [`Gate::ran_on`] (always `None` without a gate).
    pub(super) fn ran_on(&self, node: usize, format: Format) -> Option<Format> {
        match self.nodes.get(node) {
            Some(Some(gate)) => gate.ran_on(format),
            _ => None,
        }
    }

    /// Frame `index` is done with `node`: the next frame waiting at its gate, if any.
    pub(super) fn leave(&self, node: usize, index: u64) -> Option<T> {
        match self.nodes.get(node) {
            Some(Some(gate)) => gate.leave(index),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pass_a_gate_in_index_order_whatever_order_they_arrive_in() {
        let gate = Gate::default();
        assert!(!gate.enter(2, || "two"));
        assert!(!gate.enter(1, || "one"));
        assert!(gate.enter(0, || "zero"));
        assert_eq!(gate.leave(0), Some("one"));
        assert_eq!(gate.leave(1), Some("two"));
        assert_eq!(gate.leave(2), None);
        assert!(gate.enter(3, || "three"), "the turn is 3's once 2 left");
    }

    #[test]
    fn a_node_hears_of_a_new_size_once_at_its_first_run_on_it() {
        let gate = Gate::<()>::default();
        let format = |width, height, fps| Format {
            width,
            height,
            fps: Some((fps, 1)),
        };
        let (small, large) = (format(320, 240, 15), format(640, 480, 15));
        assert_eq!(gate.ran_on(small), None, "the first run is no change");
        assert_eq!(gate.ran_on(small), None);
        assert_eq!(gate.ran_on(large), Some(small));
        assert_eq!(gate.ran_on(large), None, "told once");
        assert_eq!(
            gate.ran_on(format(640, 480, 30)),
            None,
            "a frame rate is no size"
        );
        assert_eq!(gate.ran_on(small), Some(format(640, 480, 30)));
    }
}
