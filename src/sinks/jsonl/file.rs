//! The files a `jsonl` sink appends to: whole lines only, a partial last line (a crash) cut off
//! when a file is opened, fsync as asked, and rotation by size, age and date.
//!
//! No thread of its own: called from the sink's thread only. A file is opened with `O_APPEND`
//! and written one `write` per line, so that a reader (or a crash) never sees half a line
//! except the one being written; a short or failed write is cut off again at once.
//! One writer per file is assumed (the sink remembers the file's length).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::sinks::SinkError;
use crate::sinks::common::naming::{self, Counter};
use crate::storage::{SinkFiles, Writing};

/// With `fsync = "interval"`, the longest a written line stays only in the page cache.
pub(super) const FSYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes read at a time from a file's end to find its last complete line.
const TAIL_CHUNK: u64 = 64 * 1024;

/// When lines are forced to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fsync {
    /// Never: the kernel writes them back (a power loss may lose the last ~30 s).
    Never,
    /// At most [`FSYNC_INTERVAL`] after a line is written, and when a file is closed.
    Interval,
    /// After every line (slow: one disk flush per frame).
    Always,
}

/// How files are named and when a new one starts.
#[derive(Debug, Clone)]
pub(super) struct Rotation {
    /// `path` as written, with `{source}` and `{date}` (UTC, `YYYY-MM-DD`) placeholders.
    pub template: String,
    pub max_bytes: Option<u64>,
    pub max_age: Option<Duration>,
    pub fsync: Fsync,
}

impl Rotation {
    pub(super) fn per_source(&self) -> bool {
        self.template.contains("{source}")
    }

    /// The file name for `source` on `date`, before any counter.
    fn base(&self, source: &str, date: &str) -> PathBuf {
        PathBuf::from(
            self.template
                .replace("{source}", source)
                .replace("{date}", date),
        )
    }
}

/// Today's UTC date, `YYYY-MM-DD`, and its day number (to notice midnight cheaply).
fn today() -> (String, u64) {
    let now = SystemTime::now();
    let day = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400);
    let text = humantime::format_rfc3339_seconds(now).to_string();
    (text.get(..10).unwrap_or("1970-01-01").to_owned(), day)
}

/// The files being written, one per source when the path has `{source}`, else one.
#[derive(Debug)]
pub(super) struct Files {
    rotation: Rotation,
    open: HashMap<Arc<str>, Current>,
    /// Where each file is indexed for retention (none in unit tests).
    index: Option<SinkFiles>,
}

#[derive(Debug)]
struct Current {
    file: AppendFile,
    base: PathBuf,
    number: u32,
    day: u64,
}

impl Files {
    pub(super) fn new(rotation: Rotation) -> Self {
        Self {
            rotation,
            open: HashMap::new(),
            index: None,
        }
    }

    /// Indexes every file opened in `files` (kept by the sink's retention).
    pub(super) fn indexed_in(mut self, files: SinkFiles) -> Self {
        self.index = Some(files);
        self
    }

    /// Opens `path` for `source`'s lines, indexed first.
    fn open_file(
        index: Option<&SinkFiles>,
        path: &Path,
        source: &str,
    ) -> Result<AppendFile, SinkError> {
        let writing = index
            .map(|files| files.create(path, source))
            .transpose()
            .map_err(|source| SinkError::Io {
                path: path.to_owned(),
                source,
            })?;
        let mut file = AppendFile::open(path)?;
        file.writing = writing;
        Ok(file)
    }

    /// Opens (or repairs and appends to) the file `source`'s lines go to now: the last
    /// numbered file of today's name, so a restart goes on where the last run stopped.
    fn open_for(
        rotation: &Rotation,
        index: Option<&SinkFiles>,
        source: &str,
    ) -> Result<Current, SinkError> {
        let (date, day) = today();
        let base = rotation.base(source, &date);
        let mut number = 0;
        // `events.jsonl`, `events.1.jsonl`, `events.2.jsonl`, ...
        while naming::numbered(&base, number + 1, Counter::Dot).exists() {
            number += 1;
        }
        let path = naming::numbered(&base, number, Counter::Dot);
        let file = Self::open_file(index, &path, source)?;
        Ok(Current {
            file,
            base,
            number,
            day,
        })
    }

    /// Opens the file of a path without `{source}` now, to report a problem before the run.
    pub(super) fn open_now(&mut self) -> Result<(), SinkError> {
        self.current(&Arc::from("")).map(|_| ())
    }

    /// The file for a line of `source`, rotated first if its size, age or date says so.
    fn current(&mut self, source: &Arc<str>) -> Result<&mut AppendFile, SinkError> {
        let key: Arc<str> = if self.rotation.per_source() {
            source.clone()
        } else {
            Arc::from("")
        };
        let index = self.index.as_ref();
        if !self.open.contains_key(&key) {
            let current = Self::open_for(&self.rotation, index, source)?;
            self.open.insert(key.clone(), current);
        }
        let rotation = &self.rotation;
        let Some(current) = self.open.get_mut(&key) else {
            return Err(SinkError::Other("jsonl: no open file".to_owned()));
        };
        let new_day = rotation.template.contains("{date}") && today().1 != current.day;
        let full = rotation
            .max_bytes
            .is_some_and(|max| current.file.len >= max);
        let old = rotation
            .max_age
            .is_some_and(|max| current.file.opened.elapsed() >= max);
        if new_day {
            let next = Self::open_for(rotation, index, source)?;
            let previous = std::mem::replace(current, next);
            previous.file.close(rotation.fsync)?;
        } else if full || old {
            let (path, number) =
                naming::first_free(&current.base, current.number + 1, Counter::Dot);
            tracing::info!(path = %path.display(), "rotating to a new file");
            let next = Self::open_file(index, &path, source)?;
            let previous = std::mem::replace(&mut current.file, next);
            current.number = number;
            previous.close(rotation.fsync)?;
        }
        Ok(&mut current.file)
    }

    /// Appends one whole line (ending in `\n`) to `source`'s file. On a full disk, the storage
    /// purges by its policies and the line is tried once more.
    pub(super) fn write_line(&mut self, source: &Arc<str>, line: &[u8]) -> Result<(), SinkError> {
        let fsync = self.rotation.fsync;
        let index = self.index.clone();
        let file = self.current(source)?;
        match (file.append(line), &index) {
            (Err(SinkError::Io { path, source }), Some(index))
                if crate::storage::is_full(&source) =>
            {
                if index.disk_full(&path) == 0 {
                    return Err(SinkError::DiskFull { path });
                }
                file.append(line)?;
            }
            (result, _) => result?,
        }
        if let Some(index) = &index {
            index.wrote();
        }
        match fsync {
            Fsync::Always => file.sync(),
            Fsync::Interval if file.synced.elapsed() >= FSYNC_INTERVAL => file.sync(),
            _ => Ok(()),
        }
    }

    /// Syncs the files whose interval is over (called when the sink is idle).
    pub(super) fn idle(&mut self) -> Result<(), SinkError> {
        if self.rotation.fsync != Fsync::Interval {
            return Ok(());
        }
        for current in self.open.values_mut() {
            if current.file.dirty && current.file.synced.elapsed() >= FSYNC_INTERVAL {
                current.file.sync()?;
            }
        }
        Ok(())
    }

    /// When [`Files::idle`] has a sync to do, if any.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        if self.rotation.fsync != Fsync::Interval {
            return None;
        }
        self.open
            .values()
            .filter(|c| c.file.dirty)
            .map(|c| c.file.synced + FSYNC_INTERVAL)
            .min()
    }

    /// Closes every file (synced unless `fsync = "never"`); the first error is returned.
    pub(super) fn close(self) -> Result<(), SinkError> {
        let fsync = self.rotation.fsync;
        let mut first = Ok(());
        for (_, current) in self.open {
            let closed = current.file.close(fsync);
            if first.is_ok() {
                first = closed;
            }
        }
        first
    }
}

/// One file opened for appending whole lines.
#[derive(Debug)]
pub(super) struct AppendFile {
    path: PathBuf,
    file: File,
    /// The file's length as this sink left it: a short write is cut back to it.
    len: u64,
    opened: Instant,
    /// Lines written since the last sync.
    dirty: bool,
    synced: Instant,
    /// Keeps the file from retention while it is written.
    writing: Option<Writing>,
}

impl AppendFile {
    /// Opens `path` for appending (creating it and its folder), cutting off a partial last line.
    pub(super) fn open(path: &Path) -> Result<Self, SinkError> {
        crate::sinks::create_parent(path)?;
        let io = |source| SinkError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let keep = complete_length(&mut file, len).map_err(io)?;
        if keep < len {
            file.set_len(keep).map_err(io)?;
            file.sync_data().map_err(io)?;
            tracing::warn!(
                path = %path.display(),
                bytes = len - keep,
                "the file ended in a partial line (an earlier run was cut short); removed it"
            );
        }
        let now = Instant::now();
        Ok(Self {
            path: path.to_owned(),
            file,
            len: keep,
            opened: now,
            dirty: false,
            synced: now,
            writing: None,
        })
    }

    fn io(&self, source: std::io::Error) -> SinkError {
        SinkError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends `line` in one `write`; a short or failed write is cut off, so the file only
    /// ever holds whole lines.
    pub(super) fn append(&mut self, line: &[u8]) -> Result<(), SinkError> {
        let result = match self.file.write(line) {
            Ok(n) if n == line.len() => {
                self.len += n as u64;
                self.dirty = true;
                return Ok(());
            }
            Ok(n) => Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write ({n} of {} bytes)", line.len()),
            )),
            Err(e) => Err(e),
        };
        // Nothing of this line may stay. If even that fails, the next open cuts it off.
        let _ = self.file.set_len(self.len);
        result.map_err(|e| self.io(e))
    }

    fn sync(&mut self) -> Result<(), SinkError> {
        self.file.sync_data().map_err(|e| self.io(e))?;
        self.dirty = false;
        self.synced = Instant::now();
        Ok(())
    }

    fn close(mut self, fsync: Fsync) -> Result<(), SinkError> {
        if fsync != Fsync::Never && self.dirty {
            self.sync()?;
        }
        Ok(())
    }
}

/// The length of `file` up to and including its last `\n` (0 if it has none).
fn complete_length(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut chunk = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(TAIL_CHUNK);
        chunk.resize((end - start) as usize, 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_partial_last_line_is_cut_off_and_whole_lines_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"a\":2}\n{\"a\":").unwrap();
        let mut f = AppendFile::open(&path).unwrap();
        f.append(b"{\"a\":3}\n").unwrap();
        drop(f);
        assert_eq!(lines(&path), "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
    }

    #[test]
    fn opening_appends_and_never_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        AppendFile::open(&path).unwrap().append(b"new\n").unwrap();
        assert_eq!(lines(&path), "old\nnew\n");
    }

    #[test]
    fn a_file_without_any_newline_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        std::fs::write(&path, vec![b'x'; 100_000]).unwrap();
        AppendFile::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    fn rotation(dir: &Path, template: &str, max_bytes: Option<u64>) -> Rotation {
        Rotation {
            template: dir.join(template).to_string_lossy().into_owned(),
            max_bytes,
            max_age: None,
            fsync: Fsync::Never,
        }
    }

    #[test]
    fn rotation_by_size_numbers_files_and_a_restart_goes_on_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let door: Arc<str> = Arc::from("door");
        let mut files = Files::new(rotation(dir.path(), "e.jsonl", Some(10)));
        for i in 0..5 {
            files
                .write_line(&door, format!("line{i}\n").as_bytes())
                .unwrap();
        }
        files.close().unwrap();
        // 6 bytes a line, rotated once a file holds 10 or more: two lines per file.
        assert_eq!(lines(&dir.path().join("e.jsonl")), "line0\nline1\n");
        assert_eq!(lines(&dir.path().join("e.1.jsonl")), "line2\nline3\n");
        assert_eq!(lines(&dir.path().join("e.2.jsonl")), "line4\n");
        let mut files = Files::new(rotation(dir.path(), "e.jsonl", Some(10)));
        files.write_line(&door, b"line5\n").unwrap();
        files.close().unwrap();
        assert_eq!(lines(&dir.path().join("e.2.jsonl")), "line4\nline5\n");
        assert!(!dir.path().join("e.3.jsonl").exists());
    }

    #[test]
    fn a_source_placeholder_gives_each_source_its_file_and_date_is_today() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::new(rotation(dir.path(), "{source}-{date}.jsonl", None));
        files.write_line(&Arc::from("door"), b"d\n").unwrap();
        files.write_line(&Arc::from("yard"), b"y\n").unwrap();
        files.close().unwrap();
        let date = today().0;
        assert_eq!(lines(&dir.path().join(format!("door-{date}.jsonl"))), "d\n");
        assert_eq!(lines(&dir.path().join(format!("yard-{date}.jsonl"))), "y\n");
    }
}
