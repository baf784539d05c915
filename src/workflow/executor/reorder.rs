//! Lanes: the coordinator's per-source numbering and delivery order.
//!
//! Only the coordinator touches [`Lanes`] (the executor's `run` takes `&mut self`): no lock. A
//! lane is made the first time a source name is seen and kept for the executor's life, so that
//! frame numbers, gates and delivery order carry on from one `run` to the next. Each lane numbers
//! its frames from 0 in admission order and delivers them in that order: a finished frame waits
//! only for the earlier frames of its own source.

use std::collections::VecDeque;
use std::sync::Arc;

/// One lane per source name.
#[derive(Debug)]
pub(super) struct Lanes<G, T> {
    lanes: Vec<Lane<G, T>>,
}

impl<G, T> Default for Lanes<G, T> {
    fn default() -> Self {
        Self { lanes: Vec::new() }
    }
}

#[derive(Debug)]
struct Lane<G, T> {
    source: Arc<str>,
    /// What the lane's frames share while they run (its gates).
    shared: Arc<G>,
    /// Index the next admitted frame gets.
    admitted: u64,
    /// Index of the next frame to deliver.
    delivered: u64,
    /// Finished frames from `delivered` on; `None` for those still running.
    finished: VecDeque<Option<T>>,
}

impl<G, T> Lanes<G, T> {
    /// Numbers a frame of `source`: its lane, its index in the lane, and the lane's shared
    /// state (made by `new_shared` for a source not seen before).
    pub(super) fn admit(
        &mut self,
        source: &Arc<str>,
        new_shared: impl FnOnce() -> G,
    ) -> (usize, u64, Arc<G>) {
        // Frames of one source share its name's allocation: compare pointers first.
        let found = self
            .lanes
            .iter()
            .position(|l| Arc::ptr_eq(&l.source, source))
            .or_else(|| self.lanes.iter().position(|l| l.source == *source));
        let lane = match found {
            Some(lane) => lane,
            None => {
                self.lanes.push(Lane {
                    source: source.clone(),
                    shared: Arc::new(new_shared()),
                    admitted: 0,
                    delivered: 0,
                    finished: VecDeque::new(),
                });
                self.lanes.len() - 1
            }
        };
        let l = &mut self.lanes[lane];
        let index = l.admitted;
        l.admitted += 1;
        (lane, index, l.shared.clone())
    }

    /// Takes frame `index` of `lane`, finished; hands `deliver` every frame of that lane that
    /// is now next in line, in order.
    pub(super) fn finished(
        &mut self,
        lane: usize,
        index: u64,
        item: T,
        mut deliver: impl FnMut(T),
    ) {
        let Some(l) = self.lanes.get_mut(lane) else {
            return;
        };
        let slot = usize::try_from(index.saturating_sub(l.delivered)).unwrap_or(usize::MAX);
        if l.finished.len() <= slot {
            l.finished.resize_with(slot + 1, || None);
        }
        l.finished[slot] = Some(item);
        while let Some(Some(_)) = l.finished.front() {
            let Some(Some(item)) = l.finished.pop_front() else {
                break;
            };
            l.delivered += 1;
            deliver(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_is_delivered_in_its_own_order_without_waiting_for_another() {
        let mut lanes: Lanes<(), &str> = Lanes::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let (la, a0, _) = lanes.admit(&a, || ());
        let (_, a1, _) = lanes.admit(&a, || ());
        // Another allocation of the same name is the same lane.
        let (lb, b0, _) = lanes.admit(&"b".into(), || ());
        assert_eq!((a0, a1, b0), (0, 1, 0));
        assert_ne!(la, lb);
        let mut out = Vec::new();
        lanes.finished(la, a1, "a1", |x| out.push(x));
        assert!(out.is_empty(), "a1 waits for a0");
        lanes.finished(lb, b0, "b0", |x| out.push(x));
        assert_eq!(out, ["b0"], "b does not wait for a");
        lanes.finished(la, a0, "a0", |x| out.push(x));
        assert_eq!(out, ["b0", "a0", "a1"]);
        let (_, b1, _) = lanes.admit(&b, || ());
        assert_eq!(b1, 1);
    }
}
