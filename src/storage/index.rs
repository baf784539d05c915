//! The index of one folder: `.vidflow-files.jsonl`, beside the files vidflow wrote there.
//!
//! It is what makes deletion safe: a file is only ever deleted if a line here says vidflow
//! created it, so a file a user puts in the folder (even one named like a segment) is never
//! touched. One line per event, appended with one `write` (`O_APPEND`):
//! - `{"add":NAME,"sink":..,"source":..,"class":..,"t":MS}` before the file is created, so no
//!   file of ours exists unindexed (a crash between the two leaves a line for a missing file,
//!   which loading drops);
//! - `{"close":NAME,"t":MS,"bytes":N}` when it is finished;
//! - `{"del":NAME}` once it is deleted.
//!
//! A partial last line (a crash mid-write) is skipped. Names are plain file names: a line
//! naming a path (`/`, `..`) is refused, so an edited index cannot reach outside its folder.
//! No thread: called under the storage's lock. Rewritten (to a temporary file, then renamed)
//! when most of its lines describe deleted files.
//!
//! One daemon per folder: `.vidflow-files.lock` beside it is locked (`flock`) from before the
//! index is read until the storage closes it. The lock is on that file, never replaced, not on
//! the index (which a rewrite replaces): so it is held without a gap across a rewrite, where
//! another process could otherwise take the new index between the rename and the re-lock.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Class;

/// The index's file name, in each folder vidflow writes to.
pub const INDEX: &str = ".vidflow-files.jsonl";
/// The file whose lock says that a daemon has the folder (see the module header).
pub const LOCK: &str = ".vidflow-files.lock";

/// One line of an index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Line {
    Add {
        add: String,
        sink: String,
        source: String,
        class: Class,
        t: u64,
    },
    Close {
        close: String,
        t: u64,
        bytes: u64,
    },
    Del {
        del: String,
    },
}

/// A file the index says vidflow wrote and has not deleted.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Listed {
    pub name: String,
    pub sink: String,
    pub source: String,
    pub class: Class,
    pub created: SystemTime,
    /// When it was finished, and its size then; `None` if the run writing it ended first.
    pub closed: Option<(SystemTime, u64)>,
}

pub(super) fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Whether `name` is a plain file name in its folder (not a path, not hidden, not the index).
pub(super) fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0']) && name != INDEX
}

/// An open index file.
#[derive(Debug)]
pub(super) struct Index {
    path: PathBuf,
    file: File,
    /// [`LOCK`], locked while this is open.
    _lock: File,
    /// Lines in the file, and lines that still describe a kept file (to know when to rewrite).
    pub lines: u64,
}

impl Index {
    /// Opens (creating) the index of `folder` and reads what it lists, in the order added.
    pub(super) fn open(folder: &Path) -> std::io::Result<(Self, Vec<Listed>)> {
        let path = folder.join(INDEX);
        // Locked before it is read: a second vidflow on this folder must not take in the files
        // the first is writing (it could delete one mid-write).
        let lock = lock_folder(folder)?;
        let file = OpenOptions::new().append(true).create(true).open(&path)?;
        let mut listed = Listing::default();
        let mut lines = 0;
        match File::open(&path) {
            Ok(f) => {
                for line in BufReader::new(f).split(b'\n') {
                    let line = line?;
                    lines += 1;
                    // A partial or edited line is skipped: it cannot name a file to delete.
                    let Ok(parsed) = serde_json::from_slice::<Line>(&line) else {
                        continue;
                    };
                    listed.apply(parsed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let index = Self {
            path,
            file,
            _lock: lock,
            lines,
        };
        Ok((index, listed.into_vec()))
    }

    /// Appends one line (one `write`: whole or not at all, as far as readers go).
    pub(super) fn append(&mut self, line: &Line) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        self.file.write_all(&bytes)?;
        self.lines += 1;
        Ok(())
    }

    /// Rewrites the index to list `kept` only (temporary file, fsync, rename).
    pub(super) fn rewrite(&mut self, kept: &[Line]) -> std::io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut out = std::io::BufWriter::new(File::create(&tmp)?);
            for line in kept {
                serde_json::to_writer(&mut out, line).map_err(std::io::Error::other)?;
                out.write_all(b"\n")?;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // The folder's lock was held throughout (it is not on the index).
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.lines = kept.len() as u64;
        Ok(())
    }
}

/// Takes the folder's lock, [`LOCK`] (`flock`, released when the file is closed or the process
/// ends, SIGKILL included), or says that another process holds it.
fn lock_folder(folder: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(folder.join(LOCK))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(std::io::Error::other(format!(
            "{} is in use by another vidflow process (its {LOCK} is locked)",
            folder.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// The files an index lists, as its lines are read: in the order added, a name added again
/// moving to the end.
#[derive(Debug, Default)]
struct Listing {
    order: Vec<Option<Listed>>,
    at: std::collections::HashMap<String, usize>,
}

impl Listing {
    fn apply(&mut self, line: Line) {
        match line {
            Line::Add {
                add,
                sink,
                source,
                class,
                t,
            } if plain_name(&add) => {
                if let Some(i) = self.at.remove(&add) {
                    self.order[i] = None;
                }
                self.at.insert(add.clone(), self.order.len());
                self.order.push(Some(Listed {
                    name: add,
                    sink,
                    source,
                    class,
                    created: from_millis(t),
                    closed: None,
                }));
            }
            Line::Close { close, t, bytes } => {
                if let Some(l) = self.at.get(&close).and_then(|&i| self.order[i].as_mut()) {
                    l.closed = Some((from_millis(t), bytes));
                }
            }
            Line::Del { del } => {
                if let Some(i) = self.at.remove(&del) {
                    self.order[i] = None;
                }
            }
            Line::Add { .. } => {}
        }
    }

    fn into_vec(self) -> Vec<Listed> {
        self.order.into_iter().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(name: &str) -> Line {
        Line::Add {
            add: name.to_owned(),
            sink: "rec".to_owned(),
            source: "door".to_owned(),
            class: Class::Continuous,
            t: 1_000,
        }
    }

    #[test]
    fn an_index_lists_what_was_added_and_not_deleted_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let (mut index, listed) = Index::open(dir.path()).unwrap();
        assert!(listed.is_empty());
        for line in [
            add("a.mp4"),
            add("b.mp4"),
            Line::Close {
                close: "a.mp4".to_owned(),
                t: 2_000,
                bytes: 7,
            },
            Line::Del {
                del: "b.mp4".to_owned(),
            },
            add("c.mp4"),
        ] {
            index.append(&line).unwrap();
        }
        drop(index);
        let (_, listed) = Index::open(dir.path()).unwrap();
        let names: Vec<_> = listed.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a.mp4", "c.mp4"]);
        assert_eq!(listed[0].closed, Some((from_millis(2_000), 7)));
        assert_eq!(listed[1].closed, None);
    }

    #[test]
    fn a_partial_last_line_and_names_that_are_paths_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{}\n{}\n{}\n{}\n{{\"add\":\"half",
            serde_json::to_string(&add("ok.mp4")).unwrap(),
            serde_json::to_string(&add("../outside.mp4")).unwrap(),
            serde_json::to_string(&add("/etc/passwd")).unwrap(),
            serde_json::to_string(&add(INDEX)).unwrap(),
        );
        std::fs::write(dir.path().join(INDEX), text).unwrap();
        let (_, listed) = Index::open(dir.path()).unwrap();
        let names: Vec<_> = listed.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["ok.mp4"]);
    }

    #[test]
    fn a_rewritten_index_keeps_only_the_lines_given() {
        let dir = tempfile::tempdir().unwrap();
        let (mut index, _) = Index::open(dir.path()).unwrap();
        for n in 0..10 {
            index.append(&add(&format!("{n}.mp4"))).unwrap();
        }
        index.rewrite(&[add("9.mp4")]).unwrap();
        index.append(&add("10.mp4")).unwrap();
        // (Closed first: an open index's folder is locked, across the rewrite too.)
        assert!(Index::open(dir.path()).is_err());
        drop(index);
        let (index, listed) = Index::open(dir.path()).unwrap();
        let names: Vec<_> = listed.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["9.mp4", "10.mp4"]);
        assert_eq!(index.lines, 2);
    }

    #[test]
    fn no_other_opener_gets_the_folder_while_its_index_is_rewritten() {
        // Another process's daemon opening the folder, in a loop, while this one rewrites its
        // index again and again: it must never get in (it would take in, and could delete, the
        // files this one is writing). A lock on the index itself had a gap between the rename
        // and the re-lock that the opener won (and this one's rewrite then failed).
        let dir = tempfile::tempdir().unwrap();
        let (mut index, _) = Index::open(dir.path()).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (folder, stopped) = (dir.path().to_owned(), stop.clone());
        let opener = std::thread::spawn(move || {
            let (mut tries, mut got_in) = (0u64, 0u64);
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                tries += 1;
                if Index::open(&folder).is_ok() {
                    got_in += 1;
                }
            }
            (tries, got_in)
        });
        let mut failed = 0;
        for n in 0..300 {
            if index.rewrite(&[add(&format!("{n}.mp4"))]).is_err() {
                failed += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (tries, got_in) = opener.join().unwrap();
        assert!(tries > 0);
        assert_eq!((got_in, failed), (0, 0), "{tries} tries");
    }
}
