//! State a stateful step keeps for each source (a tracker's tracks, a counter's totals).
//!
//! Threads: none of its own. The map's lock is held only to find (or add) a source's state,
//! never while a step works on it, so sources do not queue behind each other; the executor
//! never runs a stateful step for two frames of one source at once, so a state's own lock is
//! uncontended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug, Default)]
pub(super) struct PerSource<T> {
    states: Mutex<HashMap<Arc<str>, Arc<Mutex<T>>>>,
}

impl<T: Default> PerSource<T> {
    /// Runs `f` on the state of `source`, made empty on its first frame.
    pub(super) fn with<R>(&self, source: &Arc<str>, f: impl FnOnce(&mut T) -> R) -> R {
        let state = {
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            states.entry(source.clone()).or_default().clone()
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_has_its_own_state() {
        let counts = PerSource::<u32>::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        counts.with(&a, |n| *n += 1);
        counts.with(&a, |n| *n += 1);
        counts.with(&b, |n| *n += 5);
        assert_eq!(counts.with(&a, |n| *n), 2);
        assert_eq!(counts.with(&b, |n| *n), 5);
    }
}
