//! What is kept and what goes: the files vidflow wrote (from its indexes), the policies, and
//! one purge pass. No thread: the storage thread and a sink that found its disk full call it
//! under the storage's lock.
//!
//! A pass, oldest first ("oldest": added first to the indexes), a file being written never:
//! 1. files older than their sink's or their source's `retain_days`;
//! 2. for each sink over its `max_gb`: its oldest files;
//! 3. for each source over its `max_gb`: its oldest files, continuous footage before event
//!    clips and snapshots before logs;
//! 4. for each filesystem under `[storage] min_free_*`: the oldest files on it, in that order.
//!
//! A file being written counts as its size plus its sink's expected file size (a segment grows
//! by up to that before it ends). A file that would start over a cap so counted has a pass run
//! before it is created ([`State::over_cap`]); and while a cap has a file being written, the
//! thread checks the growth of the open files (and of those started since) every
//! [`super::WATCH_INTERVAL`] and runs a pass once they have used half the room left: so a cap
//! holds while files grow, even one that outgrows its expected size. At most [`PASS_BUDGET`] files go per pass; a pass that
//! stopped there asks for the next at once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::disk::{self, Space};
use super::index::{self, Index, Line};
use super::{Class, FilePolicy, Floor, Retention, Shows};

/// Files deleted at most per pass: bounds the time the storage's lock is held.
pub const PASS_BUDGET: usize = 256;

/// One kept file.
#[derive(Debug)]
pub(super) struct Entry {
    pub folder: PathBuf,
    pub name: String,
    pub sink: Arc<str>,
    pub source: Arc<str>,
    pub class: Class,
    pub created: SystemTime,
    pub closed: Option<SystemTime>,
    pub bytes: u64,
    /// Being written: never deleted.
    pub open: bool,
    /// When deleting it last failed (EACCES, EBUSY, EROFS, ...): it is still on the disk, so it
    /// still counts against its caps and stays in the index, but passes leave it alone for
    /// [`DELETE_RETRY`] and free room with other files.
    pub undeletable: Option<std::time::Instant>,
    /// The frames of its source (first and last number) it was made for, as its sink said
    /// (`Writing::made_for`); not kept in the index: a file of an earlier run has none.
    pub made_for: Option<(u64, u64)>,
    /// What it shows of those frames (the last said: a crop is one frame's).
    pub shows: Shows,
}

impl Entry {
    /// Whether a pass may plan to delete it: not being written, and no failed delete within
    /// [`DELETE_RETRY`].
    fn deletable(&self) -> bool {
        !self.open
            && self
                .undeletable
                .is_none_or(|at| at.elapsed() >= DELETE_RETRY)
    }
}

impl Entry {
    pub(super) fn path(&self) -> PathBuf {
        self.folder.join(&self.name)
    }
}

#[derive(Debug)]
struct Folder {
    index: Index,
    dev: u64,
}

/// The counts of one sink's files, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SinkTotals {
    pub kept_files: u64,
    pub kept_bytes: u64,
    pub purged_files: u64,
    pub purged_bytes: u64,
    /// Times a write found its filesystem full.
    pub disk_full: u64,
    /// Deletes that failed (the file is kept, listed and counted; tried again later).
    pub undeletable: u64,
}

/// Why a file was deleted (for the pass's log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Age,
    SinkCap,
    SourceCap,
    FreeSpace,
    DiskFull,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Self::Age => "retain_days",
            Self::SinkCap => "sink max_gb",
            Self::SourceCap => "source max_gb",
            Self::FreeSpace => "min_free",
            Self::DiskFull => "disk full",
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub files: u64,
    pub bytes: u64,
    pub reasons: BTreeMap<Reason, u64>,
    /// The budget ran out: another pass is due at once.
    pub more: bool,
    /// Files planned that could not be deleted (still on the disk, still listed): another
    /// pass, with other files, is due at once.
    pub failed: u64,
}

impl Pass {
    /// Adds what `other`, a pass right after this one, did.
    fn and(mut self, other: Pass) -> Pass {
        self.files += other.files;
        self.bytes += other.bytes;
        for (reason, n) in other.reasons {
            *self.reasons.entry(reason).or_default() += n;
        }
        self.more = other.more;
        self.failed += other.failed;
        self
    }
}

#[derive(Debug, Default)]
pub(super) struct State {
    folders: HashMap<PathBuf, Folder>,
    /// Kept files by id: ids grow as files are added, so this is oldest first.
    pub(super) entries: BTreeMap<u64, Entry>,
    pub(super) by_path: HashMap<PathBuf, u64>,
    next_id: u64,
    pub sinks: HashMap<Arc<str>, FilePolicy>,
    pub sources: HashMap<String, Retention>,
    pub floor: Floor,
    pub totals: BTreeMap<String, SinkTotals>,
    /// Each filesystem's space as last seen, by device, with the first folder seen on it.
    pub spaces: BTreeMap<u64, (PathBuf, Space)>,
    /// After the last pass: the least room left under any cap, and the size then of each file
    /// being written (see [`State::grown_past_slack`]). `None`: no cap has a file open.
    slack: Option<u64>,
    open_at_pass: Vec<(u64, u64)>,
    /// Files started since the last pass: their whole size is growth.
    opened_since_pass: Vec<u64>,
}

impl State {
    pub(super) fn new(floor: Floor, sources: HashMap<String, Retention>) -> Self {
        Self {
            floor,
            sources,
            ..Self::default()
        }
    }
}

impl State {
    /// Whether anything may ever be deleted: without a policy, vidflow deletes nothing.
    pub(super) fn has_policy(&self) -> bool {
        self.floor.is_set()
            || self.sinks.values().any(|p| p.retention.is_set())
            || self.sources.values().any(Retention::is_set)
    }

    /// The index of `folder`, opened (and its files taken in) on first use.
    fn folder(&mut self, folder: &Path) -> std::io::Result<&mut Folder> {
        if !self.folders.contains_key(folder) {
            // The sink is about to make a file there.
            std::fs::create_dir_all(folder)?;
            let (index, listed) = Index::open(folder)?;
            let dev = disk::device(folder)?;
            for l in listed {
                let path = folder.join(&l.name);
                // A file listed but gone (deleted by hand, or never created) is forgotten.
                let Some(bytes) = disk::file_size(&path) else {
                    continue;
                };
                let id = self.next_id;
                self.next_id += 1;
                self.by_path.insert(path, id);
                self.entries.insert(
                    id,
                    Entry {
                        folder: folder.to_owned(),
                        name: l.name,
                        sink: l.sink.into(),
                        source: l.source.into(),
                        class: l.class,
                        created: l.created,
                        closed: l.closed.map(|(t, _)| t),
                        bytes,
                        open: false,
                        undeletable: None,
                        made_for: None,
                        shows: Shows::Frame,
                    },
                );
            }
            if let Ok(space) = disk::space(folder) {
                self.spaces
                    .entry(dev)
                    .or_insert_with(|| (folder.to_owned(), space));
            }
            self.folders
                .insert(folder.to_owned(), Folder { index, dev });
        }
        self.folders
            .get_mut(folder)
            .ok_or_else(|| std::io::Error::other("folder not indexed"))
    }

    /// Indexes `path` as a file of `sink` being written (before it is created). A file listed
    /// already (a log appended to again) is reopened.
    pub(super) fn add(
        &mut self,
        path: &Path,
        sink: &Arc<str>,
        source: &Arc<str>,
        class: Class,
        now: SystemTime,
    ) -> std::io::Result<()> {
        let (folder, name) = split(path)?;
        if let Some(&id) = self.by_path.get(path)
            && let Some(entry) = self.entries.get_mut(&id)
        {
            entry.open = true;
            self.watch_new(id);
            return Ok(());
        }
        self.folder(&folder)?.index.append(&Line::Add {
            add: name.clone(),
            sink: sink.to_string(),
            source: source.to_string(),
            class,
            t: index::millis(now),
        })?;
        let id = self.next_id;
        self.next_id += 1;
        self.by_path.insert(path.to_owned(), id);
        self.watch_new(id);
        self.entries.insert(
            id,
            Entry {
                folder,
                name,
                sink: sink.clone(),
                source: source.clone(),
                class,
                created: now,
                closed: None,
                bytes: disk::file_size(path).unwrap_or(0),
                open: true,
                undeletable: None,
                made_for: None,
                shows: Shows::Frame,
            },
        );
        Ok(())
    }

    /// Adds frame `seq` to those `path` was made for, showing `shows` of it.
    pub(super) fn made_for(&mut self, path: &Path, seq: u64, shows: Shows) {
        let Some(entry) = self
            .by_path
            .get(path)
            .and_then(|id| self.entries.get_mut(id))
        else {
            return;
        };
        entry.made_for = Some(
            entry
                .made_for
                .map_or((seq, seq), |(first, last)| (first.min(seq), last.max(seq))),
        );
        entry.shows = shows;
    }

    /// Marks `path` finished: its size is taken, and written in the index.
    pub(super) fn close(&mut self, path: &Path, now: SystemTime) {
        let Some(&id) = self.by_path.get(path) else {
            return;
        };
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.open = false;
        entry.closed = Some(now);
        entry.bytes = disk::file_size(path).unwrap_or(entry.bytes);
        let line = Line::Close {
            close: entry.name.clone(),
            t: index::millis(now),
            bytes: entry.bytes,
        };
        let folder = entry.folder.clone();
        if let Some(f) = self.folders.get_mut(&folder) {
            // Lost, the line only costs the size being read again at the next start.
            let _ = f.index.append(&line);
        }
    }

    /// Deletes `path`, one of ours, at once (an empty file the disk had no room for). A file
    /// that cannot be deleted stays listed (a later pass may).
    pub(super) fn forget(&mut self, path: &Path) {
        if let Some(&id) = self.by_path.get(path)
            && delete(path).is_ok()
        {
            self.remove(id);
        }
    }

    /// Closes every index and forgets what they listed (the storage stopped).
    pub(super) fn release(&mut self) {
        self.folders.clear();
        self.entries.clear();
        self.by_path.clear();
    }

    /// Forgets entry `id` (its file is gone): the index says so.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        self.by_path.remove(&e.path());
        if let Some(f) = self.folders.get_mut(&e.folder) {
            let _ = f.index.append(&Line::Del {
                del: e.name.clone(),
            });
        }
        Some(e)
    }

    /// Counts a write that found the filesystem full.
    pub(super) fn count_disk_full(&mut self, sink: &str) {
        self.totals.entry(sink.to_owned()).or_default().disk_full += 1;
    }

    /// One purge pass at `now` (see the module header).
    pub(super) fn pass(&mut self, now: SystemTime) -> Pass {
        for entry in self.entries.values_mut().filter(|e| e.open) {
            entry.bytes = disk::file_size(&entry.path()).unwrap_or(entry.bytes);
        }
        let mut plan = Plan::default();
        self.plan_age(now, &mut plan);
        self.plan_sink_caps(&mut plan);
        self.plan_source_caps(&mut plan);
        self.plan_floor(&mut plan, None);
        let pass = self.execute(plan);
        self.measure_slack();
        pass
    }

    /// Whether the files being written grew, since the last pass, by half the room their caps
    /// had left then: a pass is due before they grow past a cap. A file started since counts
    /// whole. Stats only those files.
    pub(super) fn grown_past_slack(&self) -> bool {
        let Some(slack) = self.slack else {
            return false;
        };
        let size = |id: u64| disk::file_size(&self.entries.get(&id)?.path());
        let grown: u64 = self
            .open_at_pass
            .iter()
            .filter_map(|&(id, then)| Some(size(id)?.saturating_sub(then)))
            .chain(self.opened_since_pass.iter().filter_map(|&id| size(id)))
            .sum();
        grown >= slack / 2
    }

    /// Counts file `id`, started now, in the growth watched (while a cap is watched: passes
    /// then run, and each clears the list).
    fn watch_new(&mut self, id: u64) {
        if self.slack.is_some() {
            self.opened_since_pass.push(id);
        }
    }

    /// Whether `path`, just added, leaves its sink or its source over a cap (counting it as
    /// one expected file): the file must not start before a pass makes room for it.
    pub(super) fn over_cap(&self, path: &Path) -> bool {
        let Some(new) = self.by_path.get(path).and_then(|id| self.entries.get(id)) else {
            return false;
        };
        let sink_cap = self
            .sinks
            .get(&new.sink)
            .and_then(|p| p.retention.max_bytes);
        let source_cap = self.sources.get(&*new.source).and_then(|r| r.max_bytes);
        if sink_cap.is_none() && source_cap.is_none() {
            return false;
        }
        let (mut sink, mut source) = (0, 0);
        for e in self.entries.values() {
            if e.sink == new.sink {
                sink += self.counted(e);
            }
            if e.source == new.source {
                source += self.counted(e);
            }
        }
        sink_cap.is_some_and(|cap| sink > cap) || source_cap.is_some_and(|cap| source > cap)
    }

    /// Whether a cap has a file being written (the thread then watches its growth).
    pub(super) fn watching(&self) -> bool {
        self.slack.is_some()
    }

    /// Records the room left under the caps and the open files' sizes (after a pass).
    fn measure_slack(&mut self) {
        let mut slack: Option<u64> = None;
        let mut open = Vec::new();
        let mut under = |total: u64, cap: u64| {
            let left = cap.saturating_sub(total);
            slack = Some(slack.map_or(left, |s: u64| s.min(left)));
        };
        for (sink, policy) in &self.sinks {
            let Some(cap) = policy.retention.max_bytes else {
                continue;
            };
            let mine = self.entries.values().filter(|e| &e.sink == sink);
            if mine.clone().any(|e| e.open) {
                under(mine.map(|e| self.counted(e)).sum(), cap);
            }
        }
        for (source, retention) in &self.sources {
            let Some(cap) = retention.max_bytes else {
                continue;
            };
            let mine = self.entries.values().filter(|e| &*e.source == source);
            if mine.clone().any(|e| e.open) {
                under(mine.map(|e| self.counted(e)).sum(), cap);
            }
        }
        if slack.is_some() {
            open.extend(
                self.entries
                    .iter()
                    .filter(|(_, e)| e.open)
                    .map(|(&id, e)| (id, e.bytes)),
            );
        }
        self.slack = slack;
        self.open_at_pass = open;
        self.opened_since_pass.clear();
    }

    /// Frees room on the filesystem of `path`, which a write found full: by the floor if one
    /// is set, else at least one expected file of the largest sink there, the oldest first.
    /// Deletes nothing where no policy applies (the user asked for no deletion).
    pub(super) fn make_room(&mut self, path: &Path) -> Pass {
        let folder = path.parent().unwrap_or(Path::new("."));
        let Ok(dev) = disk::device(folder) else {
            return Pass::default();
        };
        if !self.has_policy() {
            return Pass::default();
        }
        let expected = self
            .entries
            .values()
            .filter(|e| self.dev_of(e) == Some(dev))
            .filter_map(|e| self.sinks.get(&e.sink))
            .map(|p| p.expected_file)
            .max()
            .unwrap_or(0)
            .max(MIN_ROOM);
        // Files that cannot be deleted are left out of the next plan: plan again (from the
        // free space then) until one deletes all it planned, each file failing once at most.
        let mut pass = Pass::default();
        loop {
            let mut plan = Plan::default();
            self.plan_floor(&mut plan, Some((dev, expected)));
            let empty = plan.ids.is_empty();
            let this = self.execute(plan);
            let again = this.failed > 0 && !empty;
            pass = pass.and(this);
            if !again {
                return pass;
            }
        }
    }

    fn dev_of(&self, e: &Entry) -> Option<u64> {
        self.folders.get(&e.folder).map(|f| f.dev)
    }

    /// The age limit of an entry: the shorter of its sink's and its source's.
    fn max_age(&self, e: &Entry) -> Option<std::time::Duration> {
        let sink = self.sinks.get(&e.sink).and_then(|p| p.retention.max_age);
        let source = self.sources.get(&*e.source).and_then(|r| r.max_age);
        sink.into_iter().chain(source).min()
    }

    fn plan_age(&self, now: SystemTime, plan: &mut Plan) {
        for (&id, e) in &self.entries {
            let Some(max) = self.max_age(e) else { continue };
            let last = e.closed.unwrap_or(e.created);
            if e.deletable() && now.duration_since(last).is_ok_and(|age| age > max) {
                plan.add(id, Reason::Age);
            }
        }
    }

    /// The size `e` counts for against a cap: a file being written, its size and room for
    /// one more expected file's worth (it grows until the next pass, at its end at the latest).
    fn counted(&self, e: &Entry) -> u64 {
        let expected = if e.open {
            self.sinks.get(&e.sink).map_or(0, |p| p.expected_file)
        } else {
            0
        };
        e.bytes + expected
    }

    fn plan_sink_caps(&self, plan: &mut Plan) {
        for (sink, policy) in &self.sinks {
            let Some(cap) = policy.retention.max_bytes else {
                continue;
            };
            let total: u64 = self
                .entries
                .iter()
                .filter(|(id, e)| &e.sink == sink && !plan.has(**id))
                .map(|(_, e)| self.counted(e))
                .sum();
            let over = total.saturating_sub(cap);
            self.plan_oldest(plan, over, Reason::SinkCap, |e| &e.sink == sink, false);
        }
    }

    fn plan_source_caps(&self, plan: &mut Plan) {
        for (source, retention) in &self.sources {
            let Some(cap) = retention.max_bytes else {
                continue;
            };
            let total: u64 = self
                .entries
                .iter()
                .filter(|(id, e)| &*e.source == source && !plan.has(**id))
                .map(|(_, e)| self.counted(e))
                .sum();
            let over = total.saturating_sub(cap);
            self.plan_oldest(
                plan,
                over,
                Reason::SourceCap,
                |e| &*e.source == source,
                true,
            );
        }
    }

    /// Plans the floor of each filesystem, or (`room`) frees that many bytes at least on one.
    fn plan_floor(&mut self, plan: &mut Plan, room: Option<(u64, u64)>) {
        let folders: Vec<(u64, PathBuf)> = self
            .folders
            .iter()
            .map(|(p, f)| (f.dev, p.clone()))
            .collect();
        for (dev, folder) in folders {
            let Ok(space) = disk::space(&folder) else {
                continue;
            };
            self.spaces.insert(dev, (folder, space));
        }
        let devs: Vec<(u64, Space)> = self.spaces.iter().map(|(d, (_, s))| (*d, *s)).collect();
        for (dev, space) in devs {
            let floor = self.floor.bytes(space.size);
            let need = match room {
                Some((d, _)) if d != dev => continue,
                Some((_, bytes)) => floor.max(bytes).saturating_sub(space.free).max(bytes),
                None => floor.saturating_sub(space.free),
            };
            let reason = if room.is_some() {
                Reason::DiskFull
            } else {
                Reason::FreeSpace
            };
            let on_dev = |e: &Entry| self.folders.get(&e.folder).is_some_and(|f| f.dev == dev);
            self.plan_oldest(plan, need, reason, on_dev, true);
        }
    }

    /// Plans the oldest files `within` (not being written, not planned already) until `bytes`
    /// are freed; `by_class`: continuous footage first, then events, then logs.
    fn plan_oldest(
        &self,
        plan: &mut Plan,
        bytes: u64,
        reason: Reason,
        within: impl Fn(&Entry) -> bool,
        by_class: bool,
    ) {
        let mut freed = 0;
        let classes: &[Option<Class>] = if by_class {
            &[
                Some(Class::Continuous),
                Some(Class::Event),
                Some(Class::Log),
            ]
        } else {
            &[None]
        };
        for class in classes {
            for (&id, e) in &self.entries {
                if freed >= bytes || plan.full() {
                    return;
                }
                if !e.deletable()
                    || plan.has(id)
                    || !within(e)
                    || class.is_some_and(|c| c != e.class)
                {
                    continue;
                }
                freed += e.bytes;
                plan.add(id, reason);
            }
        }
    }

    /// Deletes what `plan` lists, and forgets what it deleted. A file that cannot be deleted
    /// is neither counted as purged nor forgotten: it is marked undeletable for a while (see
    /// [`Entry::undeletable`]), so that the next pass (due at once: [`Pass::failed`]) makes
    /// the room with other files.
    fn execute(&mut self, plan: Plan) -> Pass {
        let mut pass = Pass {
            more: plan.full(),
            ..Pass::default()
        };
        for (id, reason) in plan.ids {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            let path = e.path();
            let bytes = disk::file_size(&path).unwrap_or(0);
            if let Err(err) = delete(&path) {
                let first = e.undeletable.replace(std::time::Instant::now()).is_none();
                let message = "cannot delete an old file; it is kept in the index and counted, \
                               and other files make the room";
                if first {
                    tracing::warn!(path = %path.display(), error = %err, retry_s = DELETE_RETRY.as_secs(), "{message}");
                } else {
                    tracing::debug!(path = %path.display(), error = %err, "{message}");
                }
                self.totals
                    .entry(e.sink.to_string())
                    .or_default()
                    .undeletable += 1;
                pass.failed += 1;
                continue;
            }
            let Some(e) = self.entries.remove(&id) else {
                continue;
            };
            self.by_path.remove(&path);
            if let Some(f) = self.folders.get_mut(&e.folder) {
                let _ = f.index.append(&Line::Del {
                    del: e.name.clone(),
                });
            }
            let totals = self.totals.entry(e.sink.to_string()).or_default();
            totals.purged_files += 1;
            totals.purged_bytes += bytes;
            pass.files += 1;
            pass.bytes += bytes;
            *pass.reasons.entry(reason).or_default() += 1;
        }
        self.recount();
        self.compact();
        pass
    }

    /// Refreshes each sink's kept files and bytes.
    pub(super) fn recount(&mut self) {
        for t in self.totals.values_mut() {
            t.kept_files = 0;
            t.kept_bytes = 0;
        }
        for sink in self.sinks.keys() {
            self.totals.entry(sink.to_string()).or_default();
        }
        for e in self.entries.values() {
            let t = match self.totals.get_mut(&*e.sink) {
                Some(t) => t,
                None => self.totals.entry(e.sink.to_string()).or_default(),
            };
            t.kept_files += 1;
            t.kept_bytes += e.bytes;
        }
    }

    /// Rewrites an index whose lines are mostly about deleted files.
    fn compact(&mut self) {
        if !self
            .folders
            .values()
            .any(|f| f.index.lines > COMPACT_MIN_LINES)
        {
            return;
        }
        let mut live: HashMap<&Path, u64> = HashMap::new();
        for e in self.entries.values() {
            *live.entry(&e.folder).or_default() += 1;
        }
        let due: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|(p, f)| {
                let kept = live.get(p.as_path()).copied().unwrap_or(0);
                f.index.lines > COMPACT_MIN_LINES && f.index.lines > 4 * kept
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in due {
            let kept: Vec<Line> = self
                .entries
                .values()
                .filter(|e| e.folder == path)
                .flat_map(|e| {
                    let add = Line::Add {
                        add: e.name.clone(),
                        sink: e.sink.to_string(),
                        source: e.source.to_string(),
                        class: e.class,
                        t: index::millis(e.created),
                    };
                    let close = e.closed.map(|t| Line::Close {
                        close: e.name.clone(),
                        t: index::millis(t),
                        bytes: e.bytes,
                    });
                    std::iter::once(add).chain(close)
                })
                .collect();
            if let Some(folder) = self.folders.get_mut(&path)
                && let Err(e) = folder.index.rewrite(&kept)
            {
                tracing::debug!(folder = %path.display(), error = %e, "index not rewritten");
            }
        }
    }
}

/// Room freed at least when a write finds its disk full.
const MIN_ROOM: u64 = 16 << 20;
/// How long passes leave a file alone after deleting it failed (a permission, a busy or
/// read-only filesystem: what a person fixes, not the next pass).
pub(super) const DELETE_RETRY: std::time::Duration = std::time::Duration::from_secs(600);

/// Deletes `path`; one already gone counts as deleted.
fn delete(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
/// An index shorter than this is never rewritten.
const COMPACT_MIN_LINES: u64 = 1024;

/// `path` as its folder and file name.
fn split(path: &Path) -> std::io::Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| index::plain_name(n))
        .ok_or_else(|| std::io::Error::other(format!("not a file name: {}", path.display())))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    Ok((folder, name))
}

/// Files to delete, in order, with why.
#[derive(Debug, Default)]
struct Plan {
    ids: Vec<(u64, Reason)>,
    planned: std::collections::HashSet<u64>,
}

impl Plan {
    fn add(&mut self, id: u64, reason: Reason) {
        if !self.full() && self.planned.insert(id) {
            self.ids.push((id, reason));
        }
    }

    fn has(&self, id: u64) -> bool {
        self.planned.contains(&id)
    }

    fn full(&self) -> bool {
        self.ids.len() >= PASS_BUDGET
    }
}
