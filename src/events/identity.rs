//! Which file the writer's connection has open, by its descriptor: the (device, inode) the
//! writer compares with the file at its path, to stop writing into a file that was deleted,
//! moved or replaced (`writer.rs`).
//!
//! Read by path after opening, a file deleted or replaced in between would be taken for the
//! connection's: nothing compared with nothing, or the new file with itself, and the writer
//! would write into a file no one reads, for good. SQLite does not give its descriptor (its
//! `unixFile` is private), so it is found in `/proc/self/fd`: the descriptors the opening
//! added that name the database's path (Linux writes ` (deleted)` after it once the file is
//! unlinked), each `stat`ed through its `/proc` link, which gives the open file itself, not
//! what the path names now. Another thread may open descriptors meanwhile: one of the same
//! file agrees; one of another file at the same path (an HTTP reader that opened a newer
//! file) makes two candidates, and a descriptor number closed and taken again within the
//! opening hides SQLite's: either way no identity is given, and the writer takes the opening
//! as failed and tries again ([`super::writer::REOPEN_DELAY`]), never guessing. Without
//! `/proc/self/fd` (not mounted), the file is named by path, as before: the race comes back,
//! but the store still opens. (The shipped unit's `ProtectProc=invisible` and `ProcSubset=pid`
//! leave a process its own `/proc/self/fd`.)

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file's device and inode.
pub(super) type FileId = (u64, u64);

/// The descriptors open in this process (their numbers).
pub(super) type Descriptors = HashSet<u64>;

const FDS: &str = "/proc/self/fd";

/// The descriptors open now (none if `/proc` cannot be read: then no opening is identified),
/// less the one that listed them, closed once they are read (the next opening may take its
/// number).
pub(super) fn descriptors() -> Descriptors {
    let listed: Vec<u64> = std::fs::read_dir(FDS)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    listed
        .into_iter()
        .filter(|fd| std::fs::read_link(Path::new(FDS).join(fd.to_string())).is_ok())
        .collect()
}

/// The file that a connection to `path`, opened after `before` was taken, has open: the one
/// file of the descriptors opened since that name `path` (see the module header).
pub(super) fn opened(before: &Descriptors, path: &Path) -> Option<FileId> {
    if !Path::new(FDS).is_dir() {
        return at(path);
    }
    let want = absolute(path)?;
    let deleted = format!("{} (deleted)", want.display());
    let mut found: Option<FileId> = None;
    for fd in descriptors().difference(before) {
        let link = Path::new(FDS).join(fd.to_string());
        let Ok(target) = std::fs::read_link(&link) else {
            continue;
        };
        if target != want && target.as_os_str() != deleted.as_str() {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&link) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        if found.is_some_and(|f| f != id) {
            return None;
        }
        found = Some(id);
    }
    found
}

/// The device and inode of the file at `path` now, if there is one.
pub(super) fn at(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// `path` as `/proc` names an open file: its folder's real path (links resolved) and its name.
fn absolute(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Some(std::fs::canonicalize(dir).ok()?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_a_connection_opened_is_known_after_it_is_deleted_or_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let before = descriptors();
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let first = at(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(opened(&before, &path), Some(first), "deleted");
        std::fs::write(&path, b"another").unwrap();
        assert_ne!(at(&path), Some(first));
        assert_eq!(opened(&before, &path), Some(first), "replaced");
        // Nothing opened since: nothing to name.
        assert_eq!(opened(&descriptors(), &path), None);
    }
}
