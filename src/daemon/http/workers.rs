//! The lifecycle the endpoint's own threads share: the API's (`api.rs`), the credentials
//! check's (`verify.rs`) and the live thread (`live.rs`). [`Workers::start`] spawns a number of
//! threads of one name, each running its body with the receiving end of a stop channel
//! (capacity 0: it only ever carries its disconnection) beside its work channel in a
//! `select!`.
//!
//! Stop protocol: dropping the [`Workers`] (or [`Workers::stop`]) drops the stop channel's
//! sender, which wakes every one of its threads at once; each finishes what it is doing (each
//! module bounds that) and returns; then they are joined, in the order they were started. A
//! thread that panicked is logged, not propagated: the rest of the endpoint still stops. If a
//! spawn fails, the threads already started are stopped and joined the same way before the
//! error is returned. The endpoint stops them after its loop is joined, so no new work comes
//! meanwhile (`Server`'s drop, `mod.rs`). At the end of a run the daemon gives them until
//! its stop deadline ([`Workers::stop_by`]): a thread still busy then is left, not waited for.

use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};

/// Threads of one name and one stop channel; dropping it stops and joins them.
#[derive(Debug)]
pub(super) struct Workers {
    name: &'static str,
    stop: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    /// Disconnected once every thread has returned (each holds a sender, dropped as it ends,
    /// also by a panic): what [`Workers::stop_by`] waits on.
    done: Receiver<()>,
}

impl Workers {
    /// Starts `count` threads named `name`, each running `body` with the stop channel's
    /// receiver; `body` returns once it is disconnected (or its work channel is).
    pub(super) fn start<F>(name: &'static str, count: usize, body: F) -> std::io::Result<Self>
    where
        F: Fn(&Receiver<()>) + Clone + Send + 'static,
    {
        let (stop, stopped) = bounded::<()>(0);
        let (ending, done) = bounded::<()>(0);
        let mut workers = Self {
            name,
            stop: Some(stop),
            threads: Vec::with_capacity(count),
            done,
        };
        for _ in 0..count {
            let (body, stopped, ending) = (body.clone(), stopped.clone(), ending.clone());
            // On an error, `workers` is dropped: those already started are stopped and joined.
            workers
                .threads
                .push(
                    std::thread::Builder::new()
                        .name(name.to_owned())
                        .spawn(move || {
                            let _ending = ending;
                            body(&stopped);
                        })?,
                );
        }
        Ok(workers)
    }

    /// Stops and joins the threads (as dropping does).
    pub(super) fn stop(self) {
        drop(self);
    }

    /// Stops the threads and joins them if they all return by `until`; else leaves them
    /// (detached, never joined: the process is ending) and returns false.
    pub(super) fn stop_by(mut self, until: Instant) -> bool {
        drop(self.stop.take());
        if let Err(RecvTimeoutError::Timeout) = self.done.recv_deadline(until) {
            tracing::error!(
                thread = self.name,
                "http: a thread of the endpoint did not stop by the stop deadline; abandoned"
            );
            self.threads.clear();
            return false;
        }
        true
    }

    pub(super) fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        drop(self.stop.take());
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!(
                    thread = self.name,
                    "http: a thread of the endpoint panicked"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_stop_wakes_every_thread_and_joins_it_and_the_threads_have_their_name() {
        let (ended, names) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(std::sync::Mutex::new(Vec::new())),
        );
        let (seen, done) = (names.clone(), ended.clone());
        let workers = Workers::start("vidflow-test-w", 3, move |stopped| {
            seen.lock()
                .unwrap()
                .push(std::thread::current().name().map(str::to_owned));
            // Blocks until the stop: nothing is ever sent.
            assert!(stopped.recv().is_err());
            done.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        workers.stop();
        // Joined: every body has returned by now.
        assert_eq!(ended.load(Ordering::SeqCst), 3);
        let names = names.lock().unwrap();
        assert_eq!(names.len(), 3);
        assert!(names.iter().all(|n| n.as_deref() == Some("vidflow-test-w")));
    }

    #[test]
    fn a_thread_that_panicked_does_not_keep_the_others_from_stopping() {
        let ended = Arc::new(AtomicUsize::new(0));
        let done = ended.clone();
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let workers = Workers::start("vidflow-test-p", 2, move |stopped| {
            if first.swap(false, Ordering::SeqCst) {
                panic!("on purpose");
            }
            let _ = stopped.recv();
            done.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        drop(workers);
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    }
}
