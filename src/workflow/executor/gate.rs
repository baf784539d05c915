//! Gates: a stateful node sees the frames of one source one at a time, in admission order.
//!
//! Each lane (source) has its own [`Gates`], one [`Gate`] per stateful node, so frames of
//! different sources never queue behind each other. A gate's lock is taken by the thread that
//! makes the node ready for a frame (`enter`) and by the thread that finishes it (`leave`), only
//! for the bookkeeping, never while a step runs. A frame that is ready before its turn is kept
//! in the gate (`waiting`) and handed back by `leave` to the thread finishing the frame before
//! it, which queues it: nobody waits on the lock for a turn.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use super::super::graph::Graph;

/// Lets one node run for frames one at a time, in order of their index in the lane.
pub(super) struct Gate<T> {
    state: Mutex<GateState<T>>,
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
}
