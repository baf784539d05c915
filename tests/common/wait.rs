//! Waiting for something a test cannot be told about (a thread ending, a file growing, a
//! server answering): poll it, and fail naming it past a deadline. One copy for every test.

use std::time::{Duration, Instant};

/// How often [`wait_until`] looks again: short next to what tests wait for, long enough not
/// to spin a core.
pub const POLL: Duration = Duration::from_millis(10);

/// Polls `f` every `every` until it gives `Some`, and returns it; past `deadline` the test
/// fails naming `what`.
pub fn poll<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            start.elapsed() < deadline,
            "never happened within {deadline:?}: {what}"
        );
        std::thread::sleep(every);
    }
}

/// Polls `done` every [`POLL`] until it holds; past `deadline` the test fails naming `what`.
pub fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    poll(what, deadline, POLL, || done().then_some(()));
}
