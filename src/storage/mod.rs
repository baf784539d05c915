//! Retention: what vidflow keeps of the files it wrote, and what it deletes to stay within
//! `retain_days`, `max_gb` (per sink, per source) and `[storage] min_free_gb` /
//! `min_free_percent` (per filesystem).
//!
//! Only vidflow's own files are ever deleted: each folder it writes to has an index
//! ([`index::INDEX`]) that a file is added to before it is created, and deletion works from the
//! indexes, never from a directory listing. A file being written is never deleted. Without a
//! policy nothing is deleted at all.
//!
//! Threads: one, `vidflow-storage`, runs the purge passes ([`purge`]) off the frame path. It
//! blocks on a condvar: woken when a sink adds or finishes a file (at most once per
//! [`PASS_GAP`]), every [`PASS_INTERVAL`] when a policy is set (ages and free space change with
//! time alone), every [`WATCH_INTERVAL`] while a cap has a file being written (to stat the open
//! files: a pass runs only if they grew into the room left), and to stop. Sinks call in
//! from their own threads (and GStreamer's, when a segment is named): [`SinkFiles::create`]
//! and [`Writing`]'s drop take the storage's lock for one index line; a sink whose write found
//! the disk full calls [`SinkFiles::disk_full`], which purges on its thread at once (bounded
//! by [`purge::PASS_BUDGET`] files), so that it can retry. Likewise a file that would start
//! over a cap (counted as one expected file) has its room made by a pass on the sink's thread
//! before it is created: the thread's next pass may be a [`PASS_GAP`] away.
//!
//! What `/metrics` shows is a published snapshot ([`Storage::snapshot`]): the storage thread
//! measures a [`StorageReport`] after each pass and every [`REPORT_INTERVAL`] (the `statvfs`
//! of each filesystem outside the state lock) and swaps it in whole, under a lock held only
//! for the swap, so that a reader (the HTTP loop) never waits on a pass, a slow delete or a
//! hung mount.
//!
//! One process per folder: a folder's lock file is locked (`flock`) while its index is open,
//! rewrites included, so a second vidflow on the same folder writes its files but never takes
//! in, nor deletes, the first one's. A file whose delete fails stays listed and counted
//! (`undeletable`); passes leave it alone for [`purge::DELETE_RETRY`] and use other files.
//!
//! Stop protocol: [`Storage::stop`] (after the sinks are closed) wakes the thread, which runs a
//! last pass (for the files finished last; bounded like any pass) and ends; it is joined, and
//! the indexes are closed. Sinks still holding [`SinkFiles`] can go on indexing; nothing is
//! purged after the stop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::spec::Diagnostic;

mod disk;
pub mod index;
mod listing;
mod purge;
mod sync;

pub use disk::{Space, is_full, sync_with_folder};
pub use listing::{PageKey, StoredFile};
pub use sync::{SyncQueue, Syncer};

/// The free space of the filesystem holding `path`.
pub fn space(path: &Path) -> std::io::Result<Space> {
    disk::space(path)
}
pub use purge::{PASS_BUDGET, Pass, Reason, SinkTotals};

/// How often a pass runs when nothing wakes the thread sooner and a policy is set.
pub const PASS_INTERVAL: Duration = Duration::from_secs(10);
/// While a cap has a file being written: how often its growth is checked (a `stat` of each
/// open file), to run a pass before it outgrows the room left.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// The least time between two passes woken by files starting and ending: however many files
/// a second the sinks make (snapshots), passes stay at one a second.
pub const PASS_GAP: Duration = Duration::from_secs(1);

/// How often the storage thread publishes its report when no pass did sooner: what
/// `/metrics` shows of the storage is at most this old.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// What kind of file: the purge order under a shared limit (continuous footage goes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Continuous recording (`video_file` segments).
    Continuous,
    /// Event recordings (`clip`, `snapshot`).
    Event,
    /// Result logs (`jsonl`).
    Log,
}

/// What a file shows of the frames it was made for: which of their events it is linked to
/// (`events::link`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shows {
    /// The whole picture (a snapshot of the frame, a clip), or nothing was said of it: every
    /// event of its frames.
    #[default]
    Frame,
    /// One object (a crop around it): the events of the track with this id only; `None`, a
    /// crop of no event's track, no event's.
    Object(Option<u64>),
}

/// How long and how much of a sink's (or a source's) files are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Option<Duration>,
    pub max_bytes: Option<u64>,
}

const GB: f64 = 1e9;
/// The longest `retain_days`: a hundred years.
const MAX_DAYS: f64 = 36_525.0;

impl Retention {
    pub fn is_set(&self) -> bool {
        self.max_age.is_some() || self.max_bytes.is_some()
    }

    /// `retain_days` and `max_gb` as written; `smallest` is one file's expected size and what
    /// it is called (a cap below it could keep nothing).
    pub fn parse(
        retain_days: Option<Spanned<f64>>,
        max_gb: Option<Spanned<f64>>,
        smallest: Option<(u64, &str)>,
    ) -> Result<Self, Diagnostic> {
        let max_age = match retain_days {
            Some(d) if !(*d.get_ref() > 0.0 && *d.get_ref() <= MAX_DAYS) => {
                return Err(Diagnostic::at(
                    d.span(),
                    format!(
                        "retain_days must be more than 0 and at most {MAX_DAYS}, not {}",
                        d.get_ref()
                    ),
                ));
            }
            Some(d) => Some(Duration::from_secs_f64(d.get_ref() * 86_400.0)),
            None => None,
        };
        let max_bytes = match max_gb {
            Some(g) if !(*g.get_ref() > 0.0 && g.get_ref().is_finite()) => {
                return Err(Diagnostic::at(
                    g.span(),
                    format!("max_gb must be more than 0, not {}", g.get_ref()),
                ));
            }
            Some(g) => {
                let bytes = (g.get_ref() * GB) as u64;
                if let Some((one, what)) = smallest.filter(|(one, _)| bytes < *one) {
                    return Err(Diagnostic::at(
                        g.span(),
                        format!(
                            "max_gb = {} is smaller than one {what} ({:.3} GB): nothing could be kept",
                            g.get_ref(),
                            one as f64 / GB
                        ),
                    ));
                }
                Some(bytes)
            }
            None => None,
        };
        Ok(Self { max_age, max_bytes })
    }
}

/// `[storage]`: the free space kept on every filesystem vidflow writes to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Floor {
    pub min_free_bytes: Option<u64>,
    pub min_free_percent: Option<f64>,
}

impl Floor {
    pub fn is_set(&self) -> bool {
        self.min_free_bytes.is_some() || self.min_free_percent.is_some()
    }

    /// The free bytes wanted on a filesystem of `size` bytes: the larger of the two limits.
    pub fn bytes(&self, size: u64) -> u64 {
        let percent = self
            .min_free_percent
            .map_or(0, |p| (size as f64 * p / 100.0) as u64);
        self.min_free_bytes.unwrap_or(0).max(percent)
    }
}

/// What the storage is told at start.
#[derive(Debug, Clone, Default)]
pub struct StorageConfig {
    pub floor: Floor,
    /// `retain_days` / `max_gb` of each source that has them.
    pub sources: HashMap<String, Retention>,
}

/// The time retention measures ages with (injected by tests: no sleeping for days).
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> SystemTime;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// What a sink's files are and how long they stay.
#[derive(Debug, Clone, Copy)]
pub struct FilePolicy {
    pub class: Class,
    pub retention: Retention,
    /// The most one file of the sink grows to (a segment at its bitrate, with room for the
    /// encoder's overshoot): a file being written counts as its size plus this against a cap.
    pub expected_file: u64,
}

/// The storage's counts, for `/metrics` and the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StorageReport {
    pub sinks: std::collections::BTreeMap<String, SinkTotals>,
    pub filesystems: Vec<FilesystemReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemReport {
    /// The first folder vidflow writes to on it.
    pub folder: PathBuf,
    pub free_bytes: u64,
    pub size_bytes: u64,
}

#[derive(Debug, Default)]
struct Control {
    poked: bool,
    stop: bool,
    /// A policy is set: passes also run every [`PASS_INTERVAL`].
    periodic: bool,
    /// A cap has a file being written: its growth is checked every [`WATCH_INTERVAL`].
    watch: bool,
}

#[derive(Debug)]
struct Shared {
    /// Under this lock: the indexes and every file kept. Held for one index line by sinks,
    /// for a bounded pass by the storage thread.
    state: Mutex<purge::State>,
    control: Mutex<Control>,
    wake: Condvar,
    clock: Arc<dyn Clock>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The last report published (see the module header): written by the storage thread,
    /// swapped whole; held by anyone only for the swap or a clone of the `Arc`.
    published: Mutex<Arc<StorageReport>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The daemon's storage: one per run, shared by its sinks. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Storage {
    shared: Arc<Shared>,
}

impl Storage {
    /// Starts the storage thread.
    pub fn start(config: StorageConfig, clock: Arc<dyn Clock>) -> std::io::Result<Self> {
        let state = purge::State::new(config.floor, config.sources);
        let periodic = state.has_policy();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            control: Mutex::new(Control {
                periodic,
                ..Control::default()
            }),
            wake: Condvar::new(),
            clock,
            thread: Mutex::new(None),
            published: Mutex::default(),
        });
        let on_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vidflow-storage".to_owned())
            .spawn(move || run(&on_thread))?;
        *lock(&shared.thread) = Some(thread);
        Ok(Self { shared })
    }

    /// The files of sink `name`, kept by `policy` (replacing the policy of a sink of that
    /// name: a reload).
    pub fn sink(&self, name: &str, policy: FilePolicy) -> SinkFiles {
        let sink: Arc<str> = name.into();
        let periodic = {
            let mut state = lock(&self.shared.state);
            state.sinks.insert(sink.clone(), policy);
            state.has_policy()
        };
        lock(&self.shared.control).periodic = periodic;
        self.poke();
        SinkFiles {
            storage: self.clone(),
            sink,
            class: policy.class,
            said_full: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Takes a new `[storage]` floor and new source retention (a reload).
    pub fn configure(&self, config: StorageConfig) {
        let periodic = {
            let mut state = lock(&self.shared.state);
            state.floor = config.floor;
            state.sources = config.sources;
            state.has_policy()
        };
        lock(&self.shared.control).periodic = periodic;
        self.poke();
    }

    /// Runs one pass now, on the caller's thread.
    pub fn pass(&self) -> Pass {
        let now = self.shared.clock.now();
        lock(&self.shared.state).pass(now)
    }

    /// The counts now, and each filesystem's space as it is now (one `statvfs` each, made
    /// outside the state lock): for the run's final report.
    pub fn report(&self) -> StorageReport {
        measure(&self.shared)
    }

    /// The report the storage thread published last (see the module header): never waits on a
    /// pass or a filesystem, for the HTTP loop.
    pub fn snapshot(&self) -> Arc<StorageReport> {
        lock(&self.shared.published).clone()
    }

    /// TEST ONLY: holds the storage's state lock, as a slow purge pass does, until the guard
    /// is dropped (for the HTTP endpoint's tests: `/metrics` must answer meanwhile).
    #[cfg(test)]
    pub(crate) fn hold_lock_for_test(&self) -> impl Drop + '_ {
        lock(&self.shared.state)
    }

    fn poke(&self) {
        let mut control = lock(&self.shared.control);
        if control.periodic {
            control.poked = true;
            self.shared.wake.notify_all();
        }
    }

    /// A guard that stops the storage when dropped (on every way out of a run).
    pub fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(self.clone())
    }

    /// Stops the thread and joins it (see the module header). Idempotent.
    pub fn stop(&self) {
        lock(&self.shared.control).stop = true;
        self.shared.wake.notify_all();
        let thread = lock(&self.shared.thread).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("the storage thread panicked");
        }
        // The indexes are closed (their locks released) for whoever manages the folders next.
        lock(&self.shared.state).release();
    }
}

/// Stops its storage when dropped.
#[derive(Debug)]
pub struct StopOnDrop(Storage);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The counts now and each filesystem's space: the folders are read under the state lock, the
/// `statvfs` calls made after it is released (a filesystem not answering holds this thread
/// only), and the counts taken under it again.
fn measure(shared: &Shared) -> StorageReport {
    let folders: Vec<(u64, PathBuf)> = lock(&shared.state)
        .spaces
        .iter()
        .map(|(dev, (folder, _))| (*dev, folder.clone()))
        .collect();
    let measured: HashMap<u64, disk::Space> = folders
        .iter()
        .filter_map(|(dev, folder)| disk::space(folder).ok().map(|space| (*dev, space)))
        .collect();
    let mut state = lock(&shared.state);
    state.recount();
    StorageReport {
        sinks: state.totals.clone(),
        filesystems: state
            .spaces
            .iter()
            .map(|(dev, (folder, known))| {
                let space = measured.get(dev).unwrap_or(known);
                FilesystemReport {
                    folder: folder.clone(),
                    free_bytes: space.free,
                    size_bytes: space.size,
                }
            })
            .collect(),
    }
}

/// Measures a report and publishes it (see the module header).
fn publish(shared: &Shared) {
    let report = Arc::new(measure(shared));
    *lock(&shared.published) = report;
}

/// The storage thread's loop (see the module header).
fn run(shared: &Shared) {
    let mut last: Option<Instant> = None;
    let mut next_watch = Instant::now() + WATCH_INTERVAL;
    publish(shared);
    let mut next_report = Instant::now() + REPORT_INTERVAL;
    loop {
        let mut control = lock(&shared.control);
        loop {
            if control.stop {
                drop(control);
                return final_pass(shared);
            }
            let now = Instant::now();
            let after = |gap: Duration| last.map_or(now, |t| t + gap);
            // Passes woken by files starting and ending: at most one per PASS_GAP.
            if control.poked && after(PASS_GAP) <= now
                || control.periodic && after(PASS_INTERVAL) <= now
            {
                break;
            }
            // The growth watch runs on its own clock, a poke waiting out PASS_GAP or not.
            if control.watch && next_watch <= now {
                next_watch = now + WATCH_INTERVAL;
                if lock(&shared.state).grown_past_slack() {
                    break;
                }
            }
            if next_report <= now {
                drop(control);
                publish(shared);
                next_report = Instant::now() + REPORT_INTERVAL;
                control = lock(&shared.control);
                continue;
            }
            let deadline = [
                control.poked.then(|| after(PASS_GAP)),
                control.periodic.then(|| after(PASS_INTERVAL)),
                control.watch.then_some(next_watch),
                Some(next_report),
            ]
            .into_iter()
            .flatten()
            .min();
            control = match deadline {
                None => shared
                    .wake
                    .wait(control)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    shared
                        .wake
                        .wait_timeout(control, deadline.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        // This pass covers every poke so far.
        control.poked = false;
        drop(control);
        let now = shared.clock.now();
        let (pass, watch) = {
            let mut state = lock(&shared.state);
            let pass = state.pass(now);
            (pass, state.watching())
        };
        last = Some(Instant::now());
        next_watch = Instant::now() + WATCH_INTERVAL;
        log_pass(&pass, "purged old files");
        publish(shared);
        next_report = Instant::now() + REPORT_INTERVAL;
        let mut control = lock(&shared.control);
        control.watch = watch;
        if pass.more || pass.failed > 0 {
            control.poked = true;
            last = None;
        }
    }
}

/// The pass at the stop: the files the sinks finished last count too.
fn final_pass(shared: &Shared) {
    let pass = lock(&shared.state).pass(shared.clock.now());
    log_pass(&pass, "purged old files");
    publish(shared);
}

/// One line per pass that deleted something.
fn log_pass(pass: &Pass, message: &str) {
    if pass.files == 0 {
        return;
    }
    let reasons: Vec<String> = pass
        .reasons
        .iter()
        .map(|(r, n)| format!("{}: {n}", r.name()))
        .collect();
    tracing::info!(
        files = pass.files,
        bytes = pass.bytes,
        reasons = %reasons.join(", "),
        "{message}"
    );
}

/// What a sink writes through: it indexes each file before creating it.
#[derive(Debug, Clone)]
pub struct SinkFiles {
    storage: Storage,
    sink: Arc<str>,
    class: Class,
    /// "Disk full, nothing to delete" was said, and not since undone by a write.
    said_full: Arc<AtomicBool>,
}

impl SinkFiles {
    /// Indexes `path` (a file of `source`) before the sink creates it; it is never deleted
    /// until the returned [`Writing`] is dropped.
    pub fn create(&self, path: &Path, source: &str) -> std::io::Result<Writing> {
        let shared = &self.storage.shared;
        let now = shared.clock.now();
        let made_room = {
            let mut state = lock(&shared.state);
            state.add(path, &self.sink, &source.into(), self.class, now)?;
            // Over a cap with this file: room is made before it starts, on this thread (the
            // storage thread's next pass may be a PASS_GAP away, and the file grows meanwhile).
            state
                .over_cap(path)
                .then(|| (state.pass(now), state.watching()))
        };
        if let Some((pass, watching)) = made_room {
            log_pass(&pass, "purged old files to make room for a new one");
            lock(&shared.control).watch = watching;
        }
        self.storage.poke();
        Ok(Writing {
            files: self.clone(),
            path: path.to_owned(),
        })
    }

    /// A write to `path` found its filesystem full: purges by the policies at once. Returns
    /// the bytes freed; says once (until a write succeeds again) when nothing could be.
    pub fn disk_full(&self, path: &Path) -> u64 {
        let pass = {
            let mut state = lock(&self.storage.shared.state);
            state.count_disk_full(&self.sink);
            state.make_room(path)
        };
        log_pass(&pass, "disk full: purged old files to make room");
        if pass.bytes == 0 && !self.said_full.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                sink = %self.sink,
                path = %path.display(),
                "disk full and nothing vidflow may delete there (no retention set, or all kept \
                 files in use): frames are lost and counted until space returns; retrying"
            );
        }
        pass.bytes
    }

    /// A write succeeded: a later full disk is said again.
    pub fn wrote(&self) {
        self.said_full.store(false, Ordering::Relaxed);
    }
}

/// A file being written: never deleted while this lives. Dropping it marks the file finished.
#[derive(Debug)]
pub struct Writing {
    files: SinkFiles,
    path: PathBuf,
}

impl Writing {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Says the file was made for frame `seq` of its source (a snapshot of it, a clip it
    /// triggered) and what it `shows` of it: what links it to the frame's events, each of them
    /// (the whole picture) or one track's (a crop around it).
    pub fn made_for(&self, seq: u64, shows: Shows) {
        lock(&self.files.storage.shared.state).made_for(&self.path, seq, shows);
    }

    /// Finishes the file, removing it if nothing was written to it (a disk that was full
    /// from its first byte).
    pub fn discard_if_empty(self) {
        if disk::file_size(&self.path) == Some(0) {
            let shared = &self.files.storage.shared;
            lock(&shared.state).forget(&self.path);
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        let shared = &self.files.storage.shared;
        let now = shared.clock.now();
        lock(&shared.state).close(&self.path, now);
        self.files.storage.poke();
    }
}

#[cfg(test)]
mod tests;
