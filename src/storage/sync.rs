//! Making finished files durable off the thread that wrote them.
//!
//! A recording thread that synced each finished segment itself would wait for the disk (a slow
//! or busy disk then makes gaps in the recording), and one that synced at its next write would
//! leave a segment finished just before a stall unsynced until the end of the run. A [`Syncer`]
//! is one thread, `vidflow-sync`, that syncs each file handed to it with its folder
//! ([`sync_with_folder`](super::sync_with_folder)) as soon as it is handed over.
//!
//! Threads and channels: whoever finishes a file (a GStreamer streaming thread, a sink's
//! thread) sends its path on an unbounded channel through a [`SyncQueue`] and never waits
//! (at most one path per finished file: a handful an hour). The thread syncs them in order.
//!
//! Stop protocol: [`Syncer::flush`] waits until everything sent before it is synced, at most a
//! deadline (a dead disk must not hold a stop); dropping the [`Syncer`] sends `Stop` behind
//! what is queued and joins the thread, unless a flush gave up on it (then it is left to end
//! by itself, as a blocked `fsync` cannot be interrupted).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Sender, unbounded};

enum Job {
    Sync(PathBuf),
    /// Answered once everything sent before it is synced.
    Flush(Sender<()>),
    Stop,
}

/// Hands finished files to a [`Syncer`]'s thread; cheap to clone, never blocks.
#[derive(Clone)]
pub struct SyncQueue(Sender<Job>);

impl std::fmt::Debug for SyncQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncQueue")
    }
}

impl SyncQueue {
    /// Queues `path` to be synced with its folder.
    pub fn sync(&self, path: &Path) {
        // Fails only once the thread ended (the run's end): nothing is left to sync then.
        let _ = self.0.send(Job::Sync(path.to_owned()));
    }
}

/// The thread that syncs finished files (see the module header).
#[derive(Debug)]
pub struct Syncer {
    queue: SyncQueue,
    thread: Option<JoinHandle<()>>,
    /// Files synced so far (`Relaxed`: a count for logs and tests).
    synced: Arc<AtomicU64>,
    /// Set when a flush gave up on the thread (it is then never joined).
    stuck: AtomicBool,
}

impl Syncer {
    /// Starts the thread; `what` names the files in warnings ("segment", "clip").
    pub fn start(what: &'static str) -> std::io::Result<Self> {
        let (tx, rx) = unbounded::<Job>();
        let synced = Arc::new(AtomicU64::new(0));
        let count = synced.clone();
        let thread = std::thread::Builder::new()
            .name("vidflow-sync".to_owned())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Sync(path) => {
                            // A file removed since (empty: the disk had no room) needs none.
                            match super::sync_with_folder(&path) {
                                Ok(()) => {
                                    count.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) if path.exists() => {
                                    tracing::warn!(path = %path.display(), error = %e, "{what} not synced to the disk: a power cut may take it");
                                }
                                Err(_) => {}
                            }
                        }
                        Job::Flush(done) => {
                            let _ = done.send(());
                        }
                        Job::Stop => return,
                    }
                }
            })?;
        Ok(Self {
            queue: SyncQueue(tx),
            thread: Some(thread),
            synced,
            stuck: AtomicBool::new(false),
        })
    }

    /// A handle to queue files with.
    pub fn queue(&self) -> SyncQueue {
        self.queue.clone()
    }

    /// Waits until every file queued so far is synced, at most `within`; whether it was.
    pub fn flush(&self, within: Duration) -> bool {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.queue.0.send(Job::Flush(tx)).is_err() {
            return true;
        }
        let done = rx.recv_timeout(within).is_ok();
        if !done {
            self.stuck.store(true, Ordering::Relaxed);
        }
        done
    }

    /// Files synced so far.
    pub fn synced(&self) -> u64 {
        self.synced.load(Ordering::Relaxed)
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        let _ = self.queue.0.send(Job::Stop);
        if let Some(thread) = self.thread.take()
            && !self.stuck.load(Ordering::Relaxed)
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_synced_on_the_syncers_thread_and_a_flush_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start("segment").unwrap();
        let queue = syncer.queue();
        for i in 0..3 {
            let path = dir.path().join(format!("seg.{i}.mp4"));
            std::fs::write(&path, b"data").unwrap();
            queue.sync(&path);
        }
        // A file gone before its turn is no error and no sync.
        queue.sync(&dir.path().join("gone.mp4"));
        assert!(syncer.flush(Duration::from_secs(60)));
        assert_eq!(syncer.synced(), 3);
        drop(syncer);
        // The thread ended: a late file is dropped, never a panic.
        queue.sync(&dir.path().join("seg.0.mp4"));
    }
}
