//! What the indexes list now, for readers off the frame path (the event store's writer, the
//! HTTP API's threads): each call copies the kept files' descriptions under the storage's
//! lock, which a pass may hold for its bounded budget, so it is never called by the HTTP
//! loop or a sink.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

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
            .map(|e| StoredFile {
                path: e.path(),
                sink: e.sink.clone(),
                source: e.source.clone(),
                class: e.class,
                created: e.created,
                closed: e.closed,
                bytes: e.bytes,
                made_for: e.made_for,
            })
            .collect()
    }

    /// Whether `path` is a kept file: the only files the HTTP API serves.
    pub fn lists(&self, path: &std::path::Path) -> bool {
        lock(&self.shared.state).by_path.contains_key(path)
    }
}
