//! Which snapshot and clip show an event: a file is an event's when the sink that made it
//! reads the event's step in its `when` (so it was made because of such events) and it was
//! made for the event's frame (a snapshot of that frame, a clip that frame triggered or
//! extended), as the sink told the storage (`storage::Writing::made_for`). Never by time alone:
//! two sinks on one source, or a snapshot of the frame before, are not the event's.

use std::sync::Arc;
use std::time::Instant;

use rusqlite::{Connection, params};

use crate::storage::StoredFile;

/// An event row that sinks make files for, until both are named or [`super::writer`] gives up
/// on it (`LINK_WINDOW`).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) row: i64,
    /// Its row's `start_ms`: with its id and source, how a reopened file is known to hold it.
    pub(super) start: i64,
    pub(super) source: Arc<str>,
    /// The number of the frame it happened on.
    pub(super) frame: u64,
    /// The sinks whose `when` reads its step.
    pub(super) sinks: Arc<[Arc<str>]>,
    pub(super) since: Instant,
    pub(super) snapshot: bool,
    pub(super) clip: bool,
}

impl Pending {
    /// Whether `f` was made for this event by one of its sinks.
    fn made_for_it(&self, f: &StoredFile) -> bool {
        f.source == self.source
            && self.sinks.contains(&f.sink)
            && f.made_for
                .is_some_and(|(first, last)| (first..=last).contains(&self.frame))
    }

    fn done(&self) -> bool {
        self.snapshot && self.clip
    }
}

/// Names, in one transaction, the snapshot and clip of each `pending` event that has one among
/// `files` now (a clip once finished), and forgets the events that have both.
pub(super) fn link(
    conn: &Connection,
    files: &[StoredFile],
    pending: &mut Vec<Pending>,
) -> rusqlite::Result<()> {
    let mut found = Vec::new();
    for (i, p) in pending.iter().enumerate() {
        let mine = || files.iter().filter(|f| p.made_for_it(f));
        let snapshot = (!p.snapshot)
            .then(|| mine().find(|f| has_extension(f, "jpg")))
            .flatten();
        let clip = (!p.clip)
            .then(|| mine().find(|f| has_extension(f, "mp4") && f.closed.is_some()))
            .flatten();
        if snapshot.is_some() || clip.is_some() {
            found.push((i, snapshot, clip));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    for (i, snapshot, clip) in &found {
        let row = pending[*i].row;
        for (column, file) in [("snapshot", snapshot), ("clip", clip)] {
            if let Some(f) = file {
                tx.execute(
                    &format!("UPDATE events SET {column} = ?1 WHERE id = ?2"),
                    params![f.path.to_string_lossy(), row],
                )?;
            }
        }
    }
    tx.commit()?;
    for (i, snapshot, clip) in found {
        pending[i].snapshot |= snapshot.is_some();
        pending[i].clip |= clip.is_some();
    }
    pending.retain(|p| !p.done());
    Ok(())
}

fn has_extension(f: &StoredFile, ext: &str) -> bool {
    f.path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}
