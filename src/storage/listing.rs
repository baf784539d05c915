//! What the indexes list now, for readers off the frame path (the event store's writer, the
//! HTTP API's threads): each call copies the kept files' descriptions under the storage's
//! lock, which a pass may hold for its bounded budget, so it is never called by the HTTP
//! loop or a sink. [`Storage::page`] copies only one page of them.

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::purge::Entry;
use super::{Class, Storage, lock};

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
    /// creation and its closing), newest first (the order they were indexed in): the `limit`
    /// next below `below` (the key the page before ended at; `None`: from the newest), and the
    /// key to go on from when more remain. Only the page is copied; the walk reads the index
    /// in memory under the lock, from `below` down to the page's end (past files `keep`
    /// refuses). Keys are this run's: files listed again by another run get others.
    pub fn page(
        &self,
        class: Class,
        below: Option<u64>,
        limit: usize,
        keep: impl Fn(&str, SystemTime, Option<SystemTime>) -> bool,
    ) -> (Vec<StoredFile>, Option<u64>) {
        let state = lock(&self.shared.state);
        let upper = below.map_or(Bound::Unbounded, Bound::Excluded);
        let mut matching = state
            .entries
            .range((Bound::Unbounded, upper))
            .rev()
            .filter(|(_, e)| e.class == class && keep(&e.source, e.created, e.closed));
        let mut page = Vec::new();
        let mut last = None;
        for (&id, e) in matching.by_ref().take(limit) {
            page.push(stored(e));
            last = Some(id);
        }
        let next = matching.next().and(last);
        (page, next)
    }

    /// Whether `path` is a kept file: the only files the HTTP API serves.
    pub fn lists(&self, path: &std::path::Path) -> bool {
        lock(&self.shared.state).by_path.contains_key(path)
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
    }
}
