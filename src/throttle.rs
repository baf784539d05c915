//! Warnings that would otherwise come once per frame (a step that fails on every frame, a sink
//! whose writes fail): the first of each cause is said in full, then only a count, at most
//! once per [`INTERVAL`]: `step "detect" failed on 299 more frame(s) in the last 10.0 s: ...`.
//! What is counted and not said yet is said by [`Throttle::drain`] (the executor calls it at
//! the end of each run), so every occurrence is in the log, in a line or in a count. The
//! statistics count every occurrence whatever the log says.
//!
//! A cause is the what (a step's or sink's name) and the message. At most [`MAX_CAUSES`]
//! causes are told apart; past that, new messages of a what share one count, [`OTHER`].
//!
//! Threads: any thread may call [`Throttle::hit`]; the state is one mutex, taken once per
//! occurrence (occurrences are failures, not the frame path).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a cause that goes on is said again, as a count.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Distinct causes kept apart, in all: a message that changes with every frame cannot grow the
/// state without bound.
pub const MAX_CAUSES: usize = 64;
/// The cause of messages past [`MAX_CAUSES`].
pub const OTHER: &str = "(other errors)";

/// What to log for one occurrence (see [`Throttle::hit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// The first of its cause: say it in full.
    First,
    /// Said last `over` ago: say that it came `more` times since (this one included).
    Again { more: u64, over: Duration },
    /// Counted, to be said later.
    Counted,
}

/// Counts of one cause since it was last said.
#[derive(Debug)]
struct Tally {
    said_at: Instant,
    unsaid: u64,
}

/// What is counted and not said yet (see [`Throttle::drain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsaid {
    pub what: String,
    pub cause: String,
    pub more: u64,
    pub over: Duration,
}

#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    /// By what, then by cause.
    causes: Mutex<HashMap<String, HashMap<String, Tally>>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new(INTERVAL)
    }
}

impl Throttle {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            causes: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one occurrence of `cause` for `what`, now, and says what to log.
    pub fn hit(&self, what: &str, cause: &str) -> Say {
        self.hit_at(what, cause, Instant::now())
    }

    fn hit_at(&self, what: &str, cause: &str, now: Instant) -> Say {
        let mut causes = self.causes.lock().unwrap_or_else(PoisonError::into_inner);
        let known = causes.get(what).is_some_and(|c| c.contains_key(cause));
        let full = causes.values().map(HashMap::len).sum::<usize>() >= MAX_CAUSES;
        let cause = if known || !full { cause } else { OTHER };
        let of_what = match causes.get_mut(what) {
            Some(c) => c,
            None => causes.entry(what.to_owned()).or_default(),
        };
        let Some(tally) = of_what.get_mut(cause) else {
            let tally = Tally {
                said_at: now,
                unsaid: 0,
            };
            of_what.insert(cause.to_owned(), tally);
            return Say::First;
        };
        tally.unsaid += 1;
        let over = now.saturating_duration_since(tally.said_at);
        if over < self.interval {
            return Say::Counted;
        }
        let more = std::mem::take(&mut tally.unsaid);
        tally.said_at = now;
        Say::Again { more, over }
    }

    /// Takes the counts not said yet (each cause then starts a new interval).
    pub fn drain(&self) -> Vec<Unsaid> {
        let now = Instant::now();
        let mut causes = self.causes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for (what, of_what) in causes.iter_mut() {
            for (cause, tally) in of_what.iter_mut().filter(|(_, t)| t.unsaid > 0) {
                out.push(Unsaid {
                    what: what.clone(),
                    cause: cause.clone(),
                    more: std::mem::take(&mut tally.unsaid),
                    over: now.saturating_duration_since(tally.said_at),
                });
                tally.said_at = now;
            }
        }
        out.sort_by(|a, b| (&a.what, &a.cause).cmp(&(&b.what, &b.cause)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_a_cause_is_said_then_a_count_per_interval_and_the_rest_at_the_end() {
        let t = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(t.hit_at("detect", "no model", at(0)), Say::First);
        // Another cause, and another step, are said at once too.
        assert_eq!(t.hit_at("detect", "bad shape", at(1)), Say::First);
        assert_eq!(t.hit_at("crop", "no model", at(2)), Say::First);
        for ms in (100..10_000).step_by(100) {
            assert_eq!(t.hit_at("detect", "no model", at(ms)), Say::Counted);
        }
        assert_eq!(
            t.hit_at("detect", "no model", at(10_000)),
            Say::Again {
                more: 100,
                over: Duration::from_secs(10)
            }
        );
        assert_eq!(t.hit_at("detect", "no model", at(10_500)), Say::Counted);
        assert_eq!(t.hit_at("detect", "no model", at(10_600)), Say::Counted);
        let unsaid = t.drain();
        assert_eq!(unsaid.len(), 1, "{unsaid:?}");
        assert_eq!((unsaid[0].what.as_str(), unsaid[0].more), ("detect", 2));
        assert!(t.drain().is_empty());
    }

    #[test]
    fn messages_past_the_cap_share_one_count() {
        let t = Throttle::default();
        for n in 0..MAX_CAUSES {
            assert_eq!(t.hit("step", &format!("frame {n}")), Say::First);
        }
        assert_eq!(t.hit("step", "frame 1000"), Say::First);
        assert_eq!(t.hit("step", "frame 1001"), Say::Counted);
        assert_eq!(t.hit("step", "frame 3"), Say::Counted);
        let unsaid = t.drain();
        let other: Vec<_> = unsaid.iter().filter(|u| u.cause == OTHER).collect();
        assert_eq!(other.len(), 1);
        assert_eq!(other[0].more, 1);
    }
}
