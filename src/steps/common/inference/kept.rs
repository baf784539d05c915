//! What an engine keeps compiled for each input shape it was given, bounded by bytes: each
//! kept shape costs what compiling it took ([`Kept::get`]'s `make` says), and every [`Kept`]
//! (one per instance of a step's engine, every step) counts against one [`Budget`]. A new shape
//! that takes the total past the budget drops the least recently used shapes of the instance
//! that compiled it until it is within again, or until the instance keeps only the shape it is
//! about to run: so the kept shapes of all instances stay within the budget but for one shape
//! each (the one it runs on), and no instance drops another's (it may be running on it).
//!
//! Threads: a [`Kept`] is one instance's, used by one worker at a time
//! ([`crate::steps::common::instances::Instances`]); the [`Budget`] is shared, its total an
//! atomic added to and taken from by each instance (`Relaxed`: a sum, ordering nothing else).

use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes all instances may keep compiled, and what they keep now.
#[derive(Debug)]
pub(super) struct Budget {
    max: u64,
    /// The bytes of every shape kept by every [`Kept`] of this budget: each adds its new
    /// shapes and takes away those it drops, and all of its own when it is dropped.
    kept: AtomicU64,
}

impl Budget {
    pub(super) const fn new(max: u64) -> Self {
        Self {
            max,
            kept: AtomicU64::new(0),
        }
    }

    pub(super) fn max(&self) -> u64 {
        self.max
    }

    /// The bytes kept now, by every instance.
    pub(super) fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.kept() > self.max
    }
}

/// What [`Kept::get`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Got {
    /// The shape was kept already.
    Kept,
    /// It was made now, and `dropped` shapes used less recently were dropped for it.
    Made { dropped: usize },
}

/// One instance's compiled shapes, the least recently used first.
pub(super) struct Kept<T> {
    budget: &'static Budget,
    shapes: Vec<Shape<T>>,
}

struct Shape<T> {
    dims: Vec<i64>,
    bytes: u64,
    value: T,
}

impl<T> Kept<T> {
    pub(super) fn new(budget: &'static Budget) -> Self {
        Self {
            budget,
            shapes: Vec::new(),
        }
    }

    /// What is kept for `dims`, made by `make` (the value and the bytes it costs) when nothing
    /// is, and then marked as used last.
    pub(super) fn get<E>(
        &mut self,
        dims: &[i64],
        make: impl FnOnce() -> Result<(T, u64), E>,
    ) -> Result<(&mut T, Got), E> {
        let got = match self.shapes.iter().position(|s| s.dims == dims) {
            // Used last already: nothing moves (the common case, one shape).
            Some(i) if i + 1 == self.shapes.len() => Got::Kept,
            Some(i) => {
                let shape = self.shapes.remove(i);
                self.shapes.push(shape);
                Got::Kept
            }
            None => {
                let (value, bytes) = make()?;
                self.budget.kept.fetch_add(bytes, Ordering::Relaxed);
                self.shapes.push(Shape {
                    dims: dims.to_vec(),
                    bytes,
                    value,
                });
                let mut dropped = 0;
                while self.shapes.len() > 1 && self.budget.over() {
                    let shape = self.shapes.remove(0);
                    self.budget.kept.fetch_sub(shape.bytes, Ordering::Relaxed);
                    dropped += 1;
                }
                Got::Made { dropped }
            }
        };
        match self.shapes.last_mut() {
            Some(shape) => Ok((&mut shape.value, got)),
            None => unreachable!("a shape was found or pushed just now"),
        }
    }

    /// The shapes kept, the least recently used first.
    #[cfg(test)]
    fn dims(&self) -> Vec<Vec<i64>> {
        self.shapes.iter().map(|s| s.dims.clone()).collect()
    }
}

impl<T> Drop for Kept<T> {
    fn drop(&mut self) {
        let bytes: u64 = self.shapes.iter().map(|s| s.bytes).sum();
        self.budget.kept.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl<T> std::fmt::Debug for Kept<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<&[i64]> = self.shapes.iter().map(|s| s.dims.as_slice()).collect();
        f.debug_struct("Kept").field("shapes", &dims).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max: u64) -> &'static Budget {
        Box::leak(Box::new(Budget::new(max)))
    }

    /// Gets `side` in `kept`, made at a cost of `bytes` if it is not kept.
    fn get(kept: &mut Kept<i64>, side: i64, bytes: u64) -> Got {
        let made = || Ok::<_, ()>((side, bytes));
        let (value, got) = kept.get(&[1, 3, side, side], made).unwrap();
        assert_eq!(*value, side);
        got
    }

    fn sides(kept: &Kept<i64>) -> Vec<i64> {
        kept.dims().iter().map(|d| d[2]).collect()
    }

    #[test]
    fn a_shape_past_the_budget_drops_the_least_recently_used_until_the_rest_fit() {
        let budget = budget(100);
        let mut kept = Kept::new(budget);
        assert_eq!(get(&mut kept, 320, 30), Got::Made { dropped: 0 });
        assert_eq!(get(&mut kept, 416, 30), Got::Made { dropped: 0 });
        assert_eq!(get(&mut kept, 480, 30), Got::Made { dropped: 0 });
        // 320 used again: 416 is now the least recently used.
        assert_eq!(get(&mut kept, 320, 999), Got::Kept);
        assert_eq!(sides(&kept), [416, 480, 320]);
        assert_eq!(budget.kept(), 90);
        // 20 more fit; 40 more do not, and dropping 416 (30) is enough.
        assert_eq!(get(&mut kept, 512, 10), Got::Made { dropped: 0 });
        assert_eq!(get(&mut kept, 640, 25), Got::Made { dropped: 1 });
        assert_eq!(sides(&kept), [480, 320, 512, 640]);
        assert_eq!(budget.kept(), 95);
        // A large one drops all of the others but itself.
        assert_eq!(get(&mut kept, 800, 90), Got::Made { dropped: 4 });
        assert_eq!(sides(&kept), [800]);
        assert_eq!(budget.kept(), 90);
    }

    #[test]
    fn the_shape_about_to_run_is_kept_even_past_the_budget() {
        let budget = budget(100);
        let mut kept = Kept::new(budget);
        assert_eq!(get(&mut kept, 1088, 150), Got::Made { dropped: 0 });
        assert_eq!(get(&mut kept, 1088, 150), Got::Kept);
        assert_eq!(sides(&kept), [1088]);
        assert_eq!(budget.kept(), 150);
    }

    #[test]
    fn instances_share_the_budget_each_dropping_only_its_own_and_give_it_back_when_dropped() {
        let budget = budget(100);
        let mut a = Kept::new(budget);
        let mut b = Kept::new(budget);
        get(&mut a, 320, 40);
        get(&mut a, 416, 40);
        // b's first shape takes the total to 140: b has nothing else to drop, a is not
        // touched (its worker may be running on it).
        assert_eq!(get(&mut b, 640, 60), Got::Made { dropped: 0 });
        assert_eq!(budget.kept(), 140);
        // a's next drops its own two, least recently used first, until the total fits.
        assert_eq!(get(&mut a, 480, 20), Got::Made { dropped: 2 });
        assert_eq!(sides(&a), [480]);
        assert_eq!(budget.kept(), 80);
        drop(b);
        assert_eq!(budget.kept(), 20);
        drop(a);
        assert_eq!(budget.kept(), 0);
    }

    #[test]
    fn a_shape_that_fails_to_compile_costs_nothing_and_drops_nothing() {
        let budget = budget(100);
        let mut kept = Kept::new(budget);
        get(&mut kept, 320, 60);
        let failed = kept.get(&[1, 3, 416, 416], || Err::<(i64, u64), _>("no"));
        assert_eq!(failed.err(), Some("no"));
        assert_eq!(sides(&kept), [320]);
        assert_eq!(budget.kept(), 60);
    }
}
