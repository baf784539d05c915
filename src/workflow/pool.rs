//! The persistent worker pool.
//!
//! Threads: `size` workers named `vidflow-worker-N`, built once and kept until
//! [`Pool::shutdown`]. Channel: one unbounded crossbeam channel of [`Msg`] shared by all
//! workers; it is unbounded because the executor already bounds the work in flight
//! (`max_in_flight` frames times the steps of the graph), so a send never blocks a worker that
//! is finishing a step. An idle worker blocks in `recv`; nothing polls or spins.
//!
//! Stop protocol: `shutdown` sends one `Stop` per worker behind any queued jobs (the channel is
//! FIFO, so queued work still runs), then joins every thread; `shutdown_until` waits for them
//! only until a deadline (each worker drops its end of the `exited` channel as it ends) and
//! abandons, unjoined, a worker still in a step then. A job that panics is caught: the
//! worker survives and the pool keeps its size. Dropping a pool without `shutdown` does the
//! same, ignoring errors.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

/// A unit of work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

enum Msg {
    Run(Job),
    Stop,
}

/// Counters of one pool. Incremented by the dispatching thread (`dispatches`) and the workers
/// (`wakeups`, `panics`) with relaxed ordering: they are read for statistics only.
#[derive(Debug, Default)]
pub struct PoolMetrics {
    /// Jobs sent to the pool.
    pub dispatches: AtomicU64,
    /// Times a worker woke up from blocking on an empty queue.
    pub wakeups: AtomicU64,
    /// Jobs that panicked (caught; the worker went on).
    pub panics: AtomicU64,
    /// Workers inside a job now: raised before a job runs, lowered after (release), read by
    /// `shutdown_until` (acquire) to tell busy workers from idle ones at a deadline.
    pub busy: AtomicUsize,
}

/// How long idle workers are given, past a deadline, to take their stop and end: they do so in
/// microseconds; this is for a loaded machine's scheduler.
const IDLE_EXIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Why shutting a pool down went wrong.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("cannot start worker thread: {0}")]
    Spawn(std::io::Error),
    #[error("{0} worker thread(s) ended abnormally")]
    Join(usize),
    #[error("{0} worker thread(s) still busy at the stop deadline; abandoned")]
    Abandoned(usize),
}

/// The pool: owns its threads.
#[derive(Debug)]
pub struct Pool {
    handle: PoolHandle,
    threads: Vec<JoinHandle<()>>,
    /// Disconnects when the last worker has ended: each worker holds a sender and drops it
    /// as it exits (on a panic too), so [`Pool::shutdown_until`] can wait with a deadline.
    exited: Receiver<()>,
}

/// A cheap, cloneable way to send jobs to a pool. It does not keep the pool alive.
#[derive(Clone)]
pub struct PoolHandle {
    sender: Sender<Msg>,
    metrics: Arc<PoolMetrics>,
    size: usize,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("size", &self.size)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl Pool {
    /// Starts `size` workers (at least one).
    pub fn new(size: usize) -> Result<Self, PoolError> {
        let size = size.max(1);
        let (sender, receiver) = crossbeam_channel::unbounded();
        let metrics = Arc::new(PoolMetrics::default());
        let (exited_tx, exited) = crossbeam_channel::bounded::<()>(0);
        let mut pool = Self {
            handle: PoolHandle {
                sender,
                metrics: metrics.clone(),
                size,
            },
            threads: Vec::with_capacity(size),
            exited,
        };
        for i in 0..size {
            let receiver = receiver.clone();
            let metrics = metrics.clone();
            let exited = exited_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("vidflow-worker-{i}"))
                .spawn(move || {
                    let _exited = exited;
                    work(&receiver, &metrics);
                })
                .map_err(PoolError::Spawn)?;
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    pub fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    pub fn size(&self) -> usize {
        self.handle.size
    }

    pub fn metrics(&self) -> &Arc<PoolMetrics> {
        &self.handle.metrics
    }

    /// Runs what is queued, then stops and joins every worker.
    pub fn shutdown(mut self) -> Result<(), PoolError> {
        self.stop_and_join()
    }

    /// Like [`Pool::shutdown`], but waits for the workers only until `deadline`: workers still
    /// busy then (a step that does not return) are abandoned, never joined.
    pub fn shutdown_until(mut self, deadline: std::time::Instant) -> Result<(), PoolError> {
        for _ in 0..self.threads.len() {
            let _ = self.handle.sender.send(Msg::Stop);
        }
        loop {
            match self.exited.recv_deadline(deadline) {
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                Ok(()) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // Idle workers have their stop queued: unless one is in a job, the deadline
                    // only came before they got to it.
                    let in_jobs = self.handle.metrics.busy.load(Ordering::Acquire);
                    if in_jobs == 0 && self.exited_within(IDLE_EXIT) {
                        break;
                    }
                    // The idle ones end on their own once they take their stop.
                    let busy = match in_jobs {
                        0 => self.threads.iter().filter(|t| !t.is_finished()).count(),
                        n => n,
                    };
                    // Dropping a JoinHandle detaches its thread.
                    let joined: Vec<_> = self.threads.drain(..).collect();
                    let failed = joined
                        .into_iter()
                        .filter(JoinHandle::is_finished)
                        .map(JoinHandle::join)
                        .filter(Result::is_err)
                        .count();
                    return Err(if busy > 0 {
                        PoolError::Abandoned(busy)
                    } else {
                        PoolError::Join(failed)
                    });
                }
            }
        }
        self.stop_and_join()
    }

    /// Whether every worker ends within `grace`.
    fn exited_within(&self, grace: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + grace;
        loop {
            match self.exited.recv_deadline(until) {
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return true,
                Ok(()) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => return false,
            }
        }
    }

    fn stop_and_join(&mut self) -> Result<(), PoolError> {
        for _ in 0..self.threads.len() {
            // Fails only if every worker is gone already; the joins below then tell why.
            let _ = self.handle.sender.send(Msg::Stop);
        }
        let failed = self
            .threads
            .drain(..)
            .map(JoinHandle::join)
            .filter(Result::is_err)
            .count();
        if failed == 0 {
            Ok(())
        } else {
            Err(PoolError::Join(failed))
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.stop_and_join();
        }
    }
}

impl PoolHandle {
    /// Queues a job. Returns false if the pool has been shut down (the job is dropped).
    pub fn execute(&self, job: Job) -> bool {
        self.metrics.dispatches.fetch_add(1, Ordering::Relaxed);
        self.sender.send(Msg::Run(job)).is_ok()
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn metrics(&self) -> &Arc<PoolMetrics> {
        &self.metrics
    }
}

fn work(receiver: &Receiver<Msg>, metrics: &PoolMetrics) {
    loop {
        let msg = match receiver.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => match receiver.recv() {
                Ok(msg) => {
                    metrics.wakeups.fetch_add(1, Ordering::Relaxed);
                    msg
                }
                Err(_) => return,
            },
        };
        match msg {
            Msg::Run(job) => {
                metrics.busy.fetch_add(1, Ordering::AcqRel);
                if catch_unwind(AssertUnwindSafe(job)).is_err() {
                    metrics.panics.fetch_add(1, Ordering::Relaxed);
                }
                metrics.busy.fetch_sub(1, Ordering::Release);
            }
            Msg::Stop => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    /// Only turns a hang into a failure.
    const HANG_GUARD: Duration = Duration::from_secs(30);

    #[test]
    fn queued_jobs_run_before_shutdown_returns() {
        let pool = Pool::new(2).unwrap();
        let done = Arc::new(AtomicU64::new(0));
        for _ in 0..1000 {
            let done = done.clone();
            pool.handle().execute(Box::new(move || {
                done.fetch_add(1, Ordering::Relaxed);
            }));
        }
        pool.shutdown().unwrap();
        assert_eq!(done.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn panicking_job_leaves_the_pool_its_size() {
        let pool = Pool::new(2).unwrap();
        let h = pool.handle();
        for _ in 0..4 {
            h.execute(Box::new(|| panic!("boom")));
        }
        // Two jobs that each hold their worker until both have started: they finish only if
        // two workers are alive at once. Declared after the pool, `release` is dropped first
        // on a failure, so the held job ends and the pool's drop can join it.
        let (arrived_tx, arrived) = crossbeam_channel::unbounded();
        let (release, released) = crossbeam_channel::unbounded::<()>();
        for _ in 0..2 {
            let (arrived_tx, released) = (arrived_tx.clone(), released.clone());
            h.execute(Box::new(move || {
                arrived_tx.send(std::thread::current().id()).unwrap();
                let _ = released.recv_timeout(HANG_GUARD);
            }));
        }
        let mut threads = HashSet::new();
        for _ in 0..2 {
            let id = arrived
                .recv_timeout(HANG_GUARD)
                .expect("two jobs never ran at once: the pool lost a worker to a panic");
            threads.insert(id);
        }
        drop(release);
        assert_eq!(threads.len(), 2);
        assert_eq!(pool.metrics().panics.load(Ordering::Relaxed), 4);
        pool.shutdown().unwrap();
    }

    /// Issue 25: a deadline that had passed when the pool's turn came (a source's wait took
    /// it) reported its 2 idle workers as "still busy ... abandoned".
    #[test]
    fn idle_workers_are_joined_even_past_the_deadline_and_only_busy_ones_are_abandoned() {
        let pool = Pool::new(2).unwrap();
        let past = std::time::Instant::now();
        assert!(pool.shutdown_until(past).is_ok());

        let pool = Pool::new(3).unwrap();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (release, released) = crossbeam_channel::unbounded::<()>();
        pool.handle().execute(Box::new(move || {
            started_tx.send(()).unwrap();
            let _ = released.recv_timeout(HANG_GUARD);
        }));
        started.recv_timeout(HANG_GUARD).unwrap();
        let result = pool.shutdown_until(std::time::Instant::now());
        drop(release);
        assert!(
            matches!(result, Err(PoolError::Abandoned(1))),
            "one worker was busy, two idle: {result:?}"
        );
    }

    #[test]
    fn handle_outliving_the_pool_refuses_work() {
        let pool = Pool::new(1).unwrap();
        let h = pool.handle();
        pool.shutdown().unwrap();
        assert!(!h.execute(Box::new(|| {})));
    }
}
