//! State a stateful step keeps for each source (a tracker's tracks, a counter's totals).
//!
//! Threads: none of its own. The map's lock is held only to find, add or drop a source's
//! state, never while a step works on it, so sources do not queue behind each other; the
//! executor never runs a stateful step for two frames of one source at once, so a state's own
//! lock is uncontended. [`PerSource::reset`] runs between two frames of its source (the executor
//! calls it on the thread that ran the step, before the step's gate passes to the next frame).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug)]
pub(in crate::steps) struct PerSource<T> {
    states: Mutex<HashMap<Arc<str>, Arc<Mutex<T>>>>,
}

/// No source yet (whatever `T` is: a state that cannot be made empty is made by `with_made`).
impl<T> Default for PerSource<T> {
    fn default() -> Self {
        Self {
            states: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> PerSource<T> {
    /// Runs `f` on the state of `source`, made by `make` on its first frame (and on its first
    /// frame after a reset); fails only when `make` does.
    pub(in crate::steps) fn with_made<R, E>(
        &self,
        source: &Arc<str>,
        make: impl FnOnce() -> Result<T, E>,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, E> {
        let state = {
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            match states.get(source) {
                Some(state) => state.clone(),
                None => {
                    let state = Arc::new(Mutex::new(make()?));
                    states.insert(source.clone(), state.clone());
                    state
                }
            }
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(f(&mut state))
    }

    /// Drops the state of `source`: its next frame starts with a fresh one.
    pub(in crate::steps) fn reset(&self, source: &str) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states.remove(source);
    }
}

impl<T: Default> PerSource<T> {
    /// Runs `f` on the state of `source`, made empty on its first frame.
    pub(in crate::steps) fn with<R>(&self, source: &Arc<str>, f: impl FnOnce(&mut T) -> R) -> R {
        match self.with_made(source, || Ok::<T, Infallible>(T::default()), f) {
            Ok(r) => r,
            Err(never) => match never {},
        }
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

    #[test]
    fn a_reset_source_starts_afresh_and_the_others_keep_their_state() {
        let counts = PerSource::<u32>::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        counts.with(&a, |n| *n += 3);
        counts.with(&b, |n| *n += 5);
        counts.reset("a");
        assert_eq!(counts.with(&a, |n| *n), 0);
        assert_eq!(counts.with(&b, |n| *n), 5);
    }
}
