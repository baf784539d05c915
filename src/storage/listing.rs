//! What the indexes list now, for readers off the frame path (the event store's writer, the
//! HTTP API's threads): each call copies the kept files' descriptions under the storage's
//! lock, which a pass may hold for its bounded budget, so it is never called by the HTTP
//! loop or a sink. [`Storage::page`] copies only one page of them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::purge::Entry;
use super::{Class, Shows, Storage, lock};

/// A file vidflow wrote and has not deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredFile {
    pub path: PathBuf,
    pub sink: Arc<str>,
    pub source: Arc<str>,
    pub class: Class,
    pub created: SystemTime,
    /// When it was finished; `None` while it is written (or if its run ended first).
    pub closed: Option<SystemTime>,
    pub bytes: u64,
    /// The frames of its source (first and last number) its sink made it for.
    pub made_for: Option<(u64, u64)>,
    /// What it shows of them: the whole picture, or one object.
    pub shows: Shows,
}

impl Storage {
    /// The kept files of `class` (every class: `None`), oldest first.
    pub fn files(&self, class: Option<Class>) -> Vec<StoredFile> {
        let state = lock(&self.shared.state);
        state
            .entries
            .values()
            .filter(|e| class.is_none_or(|c| e.class == c))
            .map(stored)
            .collect()
    }

    /// One page of the kept files of `class` that `keep` takes (given a file's source, its
    /// creation and its closing), newest first by the files' own start times, across sinks
    /// and cameras (not the order they were indexed in: a restarted run indexes a folder when
    /// its sink first writes there, so an old file may be indexed after a new one): the
    /// `limit` next below `below` (the [`PageKey`] the page before ended at; `None`: from the
    /// newest), and the key to go on from when more remain. Only the page is copied: under the
    /// lock, the walk keeps the key of each file it takes (16 bytes) and picks the page's
    /// `limit` newest in linear time. Keys are this run's: files listed again by another run
    /// get others.
    pub fn page(
        &self,
        class: Class,
        below: Option<PageKey>,
        limit: usize,
        keep: impl Fn(&str, SystemTime, Option<SystemTime>) -> bool,
    ) -> (Vec<StoredFile>, Option<PageKey>) {
        let state = lock(&self.shared.state);
        let mut keys: Vec<PageKey> = state
            .entries
            .iter()
            .filter(|(_, e)| e.class == class && keep(&e.source, e.created, e.closed))
            .map(|(&id, e)| PageKey::of(id, e))
            .filter(|k| below.is_none_or(|b| *k < b))
            .collect();
        let more = keys.len() > limit;
        if more {
            // The `limit` newest at the end, in no order; then only those sorted.
            let cut = keys.len() - limit;
            keys.select_nth_unstable(cut - 1);
            keys.drain(..cut);
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let page = keys
            .iter()
            .filter_map(|k| state.entries.get(&k.id).map(stored))
            .collect();
        let next = more.then(|| keys.last().copied()).flatten();
        (page, next)
    }

    /// The kept file of `sink` named `name` (in any of its folders) whose whole path `wanted`
    /// takes, found under the lock without copying the list: only the file found is copied,
    /// and only the files of that sink and name have their paths made.
    pub fn find(
        &self,
        sink: &str,
        name: &str,
        wanted: impl Fn(&std::path::Path) -> bool,
    ) -> Option<StoredFile> {
        let state = lock(&self.shared.state);
        state
            .entries
            .values()
            .find(|e| *e.sink == *sink && e.name == name && wanted(&e.path()))
            .map(stored)
    }

    /// Whether `path` is a kept file: the only files the HTTP API serves.
    pub fn lists(&self, path: &std::path::Path) -> bool {
        lock(&self.shared.state).by_path.contains_key(path)
    }
}

/// Where a file sorts in [`Storage::page`]: its start time (ms since 1970), then its key in
/// this run's index (files started in one millisecond).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct PageKey {
    pub t: i64,
    pub id: u64,
}

impl PageKey {
    fn of(id: u64, e: &Entry) -> Self {
        let t = e
            .created
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Self { t, id }
    }
}

fn stored(e: &Entry) -> StoredFile {
    StoredFile {
        path: e.path(),
        sink: e.sink.clone(),
        source: e.source.clone(),
        class: e.class,
        created: e.created,
        closed: e.closed,
        bytes: e.bytes,
        made_for: e.made_for,
        shows: e.shows,
    }
}
