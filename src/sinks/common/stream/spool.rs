//! The disk spool of a stream sink: where messages go when the memory backlog is full (the
//! server is away longer than the backlog lasts) and what is left at a stop, replayed in order
//! when the server is back or the daemon starts again.
//!
//! No thread of its own: called under the outbox's lock (see [`super::queue`]) by the sink's
//! thread (appending) and the delivery thread (reading, committing).
//!
//! Layout of the folder (`spool_dir`): segment files `NNNNNNNNNNNNNNNNNNNN.spool` (20 digits,
//! increasing), each a JSONL file of whole messages (the payload as sent, one `write` per
//! line, so a crash leaves at most a partial last line, cut off at the next open); `head`, the
//! segment and offset of the oldest message not yet acknowledged (saved at most every
//! [`HEAD_SAVE_INTERVAL`], when a segment is done with, and at close: a crash sends again what
//! came after the last save, which the far end de-duplicates by id); `lock`, held (flock)
//! while a sink uses the folder, so two sinks or two daemons never share one. Only these files
//! are ever written or deleted here.
//!
//! Bounds: the unacknowledged bytes stay within `max_bytes`; past that the oldest segment is
//! dropped whole (a segment is at most 1/8 of the spool), its messages counted and named.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::Outgoing;
use crate::sinks::common::net::{Lost, Message};

/// How often at most the acknowledged position is written to `head` while messages flow.
const HEAD_SAVE_INTERVAL: Duration = Duration::from_secs(1);
/// The smallest and largest segment: a spool is cut into about 8 of them.
const SEGMENT_MIN: u64 = 64 * 1024;
const SEGMENT_MAX: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub(in crate::sinks) enum SpoolError {
    #[error("spool {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "spool {}: in use by another sink or vidflow process; give each sink its own spool_dir",
        path.display()
    )]
    Locked { path: PathBuf },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug)]
struct Segment {
    no: u64,
    /// Bytes of whole records in the file.
    bytes: u64,
    records: u64,
}

/// A place in the spool: a segment's number and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    no: u64,
    offset: u64,
}

/// The identity of a spooled message, read back from its payload.
#[derive(Deserialize)]
struct Identity {
    id: String,
    source: String,
    frame: u64,
}

#[derive(Debug)]
pub(in crate::sinks) struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    /// Holds the folder's lock while the spool is open.
    _lock: File,
    /// Oldest first; the last one is appended to.
    segments: VecDeque<Segment>,
    /// Appends to the last segment (opened lazily).
    writer: Option<File>,
    /// The oldest unacknowledged record: in the first segment.
    head: Pos,
    /// Records of the first segment before `head`.
    head_records: u64,
    /// Where the next unread record starts, and a reader positioned there (cached).
    read: Pos,
    reader: Option<BufReader<File>>,
    /// Lengths of the records read but not acknowledged, oldest first.
    pending: VecDeque<u64>,
    /// Unacknowledged bytes and records.
    bytes: u64,
    records: u64,
    head_saved: Instant,
}

fn segment_name(no: u64) -> String {
    format!("{no:020}.spool")
}

fn segment_no(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".spool")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, keeping what an earlier run left.
    pub(in crate::sinks) fn open(dir: &Path, max_bytes: u64) -> Result<Self, SpoolError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(SpoolError::Locked {
                path: dir.to_owned(),
            });
        }
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            if let Some(no) = entry.file_name().to_str().and_then(segment_no) {
                numbers.push(no);
            }
        }
        numbers.sort_unstable();
        let saved = std::fs::read_to_string(dir.join("head"))
            .ok()
            .and_then(|s| {
                let (no, offset) = s.trim().split_once(' ')?;
                Some(Pos {
                    no: no.parse().ok()?,
                    offset: offset.parse().ok()?,
                })
            });
        let mut segments = VecDeque::new();
        let mut head = None;
        let mut head_records = 0;
        for no in numbers {
            let path = dir.join(segment_name(no));
            if saved.is_some_and(|h| no < h.no) {
                // Acknowledged whole before the last run stopped.
                std::fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            let (bytes, records, before) = scan(&path, saved.filter(|h| h.no == no))?;
            if head.is_none() {
                head = Some(Pos {
                    no,
                    offset: before.0,
                });
                head_records = before.1;
            }
            segments.push_back(Segment { no, bytes, records });
        }
        // Numbers go on after those of earlier runs, so a saved head never names a new segment.
        let head = head.unwrap_or(Pos {
            no: saved.map_or(0, |h| h.no + 1),
            offset: 0,
        });
        let bytes = segments.iter().map(|s| s.bytes).sum::<u64>() - head.offset;
        let records = segments.iter().map(|s| s.records).sum::<u64>() - head_records;
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            segment_bytes: (max_bytes / 8).clamp(SEGMENT_MIN, SEGMENT_MAX),
            _lock: lock,
            segments,
            writer: None,
            head,
            head_records,
            read: head,
            reader: None,
            pending: VecDeque::new(),
            bytes,
            records,
            head_saved: Instant::now(),
        })
    }

    /// Unacknowledged records (read or not).
    pub(in crate::sinks) fn len(&self) -> u64 {
        self.records
    }

    /// Records read (handed out) and not acknowledged.
    pub(in crate::sinks) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Records not read yet.
    pub(in crate::sinks) fn unread(&self) -> u64 {
        self.records - self.pending.len() as u64
    }

    fn path(&self, no: u64) -> PathBuf {
        self.dir.join(segment_name(no))
    }

    /// Appends a message at the end. `read`: it is already handed out (in flight), so reading
    /// goes on after it. Returns what had to be dropped to stay within the bound: the lost
    /// messages and how many of them were handed out.
    pub(in crate::sinks) fn append(
        &mut self,
        m: &Outgoing,
        read: bool,
    ) -> Result<(Lost, usize), SpoolError> {
        let start_new = self
            .segments
            .back()
            .is_none_or(|s| s.bytes >= self.segment_bytes);
        if start_new {
            let no = self.segments.back().map_or(self.head.no, |s| s.no + 1);
            self.writer = None;
            let path = self.path(no);
            File::create(&path).map_err(io(&path))?;
            if self.segments.is_empty() {
                self.head = Pos { no, offset: 0 };
                self.head_records = 0;
                self.read = self.head;
                self.reader = None;
            }
            self.segments.push_back(Segment {
                no,
                bytes: 0,
                records: 0,
            });
        }
        let Some(last) = self.segments.back_mut() else {
            return Ok((Lost::default(), 0));
        };
        let path = self.dir.join(segment_name(last.no));
        if self.writer.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            self.writer = Some(file);
        }
        let mut line = Vec::with_capacity(m.message.body.len() + 1);
        line.extend_from_slice(&m.message.body);
        line.push(b'\n');
        if let Some(w) = self.writer.as_mut()
            && let Err(e) = w.write_all(&line)
        {
            // A short write would leave half a line: cut it off again.
            self.writer = None;
            if let Ok(f) = OpenOptions::new().write(true).open(&path) {
                let _ = f.set_len(last.bytes);
            }
            return Err(io(&path)(e));
        }
        let len = line.len() as u64;
        last.bytes += len;
        last.records += 1;
        self.bytes += len;
        self.records += 1;
        if read {
            self.pending.push_back(len);
            self.read = Pos {
                no: last.no,
                offset: last.bytes,
            };
            self.reader = None;
        }
        let mut lost = Lost::default();
        let mut lost_pending = 0;
        while self.bytes > self.max_bytes && self.segments.len() > 1 {
            lost_pending += self.drop_oldest(&mut lost)?;
        }
        Ok((lost, lost_pending))
    }

    /// Drops the first segment whole; returns how many of its records were handed out.
    fn drop_oldest(&mut self, lost: &mut Lost) -> Result<usize, SpoolError> {
        let Some(first) = self.segments.pop_front() else {
            return Ok(0);
        };
        let path = self.path(first.no);
        let mut file = File::open(&path).map_err(io(&path))?;
        file.seek(SeekFrom::Start(self.head.offset))
            .map_err(io(&path))?;
        for line in BufReader::new(file)
            .take(first.bytes - self.head.offset)
            .split(b'\n')
        {
            let line = line.map_err(io(&path))?;
            lost.add(&identify(&line).message);
        }
        std::fs::remove_file(&path).map_err(io(&path))?;
        let count = first.records - self.head_records;
        self.bytes -= first.bytes - self.head.offset;
        self.records -= count;
        let in_flight = self.pending.len().min(count as usize);
        self.pending.drain(..in_flight);
        self.head = Pos {
            no: self.segments.front().map_or(first.no + 1, |s| s.no),
            offset: 0,
        };
        self.head_records = 0;
        if self.read.no == first.no {
            self.read = self.head;
            self.reader = None;
        }
        self.save_head()?;
        Ok(in_flight)
    }

    /// Reads the next unread record.
    pub(in crate::sinks) fn read_next(&mut self) -> Result<Option<Outgoing>, SpoolError> {
        if self.unread() == 0 {
            return Ok(None);
        }
        loop {
            let Some(seg) = self.segments.iter().find(|s| s.no == self.read.no) else {
                return Ok(None);
            };
            if self.read.offset >= seg.bytes {
                let next = self.segments.iter().find(|s| s.no > self.read.no);
                let Some(next) = next else { return Ok(None) };
                self.read = Pos {
                    no: next.no,
                    offset: 0,
                };
                self.reader = None;
                continue;
            }
            let path = self.path(seg.no);
            if self.reader.is_none() {
                let mut file = File::open(&path).map_err(io(&path))?;
                file.seek(SeekFrom::Start(self.read.offset))
                    .map_err(io(&path))?;
                self.reader = Some(BufReader::with_capacity(64 * 1024, file));
            }
            let mut line = Vec::new();
            if let Some(r) = self.reader.as_mut() {
                r.read_until(b'\n', &mut line).map_err(io(&path))?;
            }
            if line.last() != Some(&b'\n') {
                // Only whole lines are counted in `bytes`: this cannot be, but must not loop.
                self.reader = None;
                return Ok(None);
            }
            let len = line.len() as u64;
            self.read.offset += len;
            self.pending.push_back(len);
            line.pop();
            return Ok(Some(identify(&line)));
        }
    }

    /// The oldest handed-out record is acknowledged.
    pub(in crate::sinks) fn commit_one(&mut self) -> Result<(), SpoolError> {
        let Some(len) = self.pending.pop_front() else {
            return Ok(());
        };
        self.head.offset += len;
        self.head_records += 1;
        self.bytes -= len;
        self.records -= 1;
        let done = self
            .segments
            .front()
            .is_some_and(|s| self.head.offset >= s.bytes && self.segments.len() > 1);
        if done && let Some(first) = self.segments.pop_front() {
            let path = self.path(first.no);
            std::fs::remove_file(&path).map_err(io(&path))?;
            self.head = Pos {
                no: self.segments.front().map_or(first.no + 1, |s| s.no),
                offset: 0,
            };
            self.head_records = 0;
            self.save_head()?;
        } else if self.head_saved.elapsed() >= HEAD_SAVE_INTERVAL {
            self.save_head()?;
        }
        Ok(())
    }

    /// Forgets what was handed out: reading starts again at the oldest unacknowledged record.
    pub(in crate::sinks) fn rewind(&mut self) {
        self.pending.clear();
        self.read = self.head;
        self.reader = None;
    }

    fn save_head(&mut self) -> Result<(), SpoolError> {
        self.head_saved = Instant::now();
        let tmp = self.dir.join("head.tmp");
        let text = format!("{} {}\n", self.head.no, self.head.offset);
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, self.dir.join("head")).map_err(io(&tmp))
    }

    /// Forces what was written to disk and saves the acknowledged position. When everything
    /// was acknowledged, the segments are removed.
    pub(in crate::sinks) fn close(mut self) -> Result<(), SpoolError> {
        if let Some(w) = self.writer.take() {
            let path = self.segments.back().map(|s| self.path(s.no));
            w.sync_all()
                .map_err(io(path.as_deref().unwrap_or(&self.dir)))?;
        }
        if self.records == 0 {
            while let Some(s) = self.segments.pop_front() {
                let path = self.path(s.no);
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        self.save_head()
    }
}

/// A spooled payload back into a message: its id, source and frame read from it. A record
/// that does not parse (a disk fault) still goes, under an id of its own.
fn identify(line: &[u8]) -> Outgoing {
    let who = serde_json::from_slice::<Identity>(line).unwrap_or_else(|_| Identity {
        id: format!("unreadable-{:016x}", fnv(line)),
        source: String::from("?"),
        frame: 0,
    });
    Outgoing {
        id: who.id.into(),
        message: Message {
            source: Arc::from(who.source),
            frame: who.frame,
            body: line.to_vec(),
        },
    }
}

/// FNV-1a: a stable name for an unreadable record.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A segment's whole records: (bytes, records, (offset, records) before `head` if given, else
/// (0, 0)). A partial last line (a crash mid-write) is cut off.
fn scan(path: &Path, head: Option<Pos>) -> Result<(u64, u64, (u64, u64)), SpoolError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io(path))?;
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    if whole < data.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io(path))?;
        f.set_len(whole as u64).map_err(io(path))?;
    }
    let data = &data[..whole];
    let records = data.iter().filter(|b| **b == b'\n').count() as u64;
    let before = match head {
        Some(h) => {
            // The saved offset is on a record boundary; clamp it to one in case it is not.
            let upto = (h.offset as usize).min(data.len());
            let cut = data[..upto]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let n = data[..cut].iter().filter(|b| **b == b'\n').count() as u64;
            (cut as u64, n)
        }
        None => (0, 0),
    };
    Ok((whole as u64, records, before))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(frame: u64) -> Outgoing {
        let body =
            format!(r#"{{"schema":1,"id":"h:cam:r:{frame}","source":"cam","frame":{frame}}}"#);
        Outgoing {
            id: format!("h:cam:r:{frame}").into(),
            message: Message {
                source: "cam".into(),
                frame,
                body: body.into_bytes(),
            },
        }
    }

    fn read_all(s: &mut Spool) -> Vec<u64> {
        std::iter::from_fn(|| s.read_next().unwrap())
            .map(|m| m.message.frame)
            .collect()
    }

    #[test]
    fn what_is_not_acknowledged_is_read_again_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        for f in 0..10 {
            s.append(&msg(f), false).unwrap();
        }
        assert_eq!(read_all(&mut s), (0..10).collect::<Vec<_>>());
        for _ in 0..4 {
            s.commit_one().unwrap();
        }
        s.close().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(s.len(), 6);
        let again = read_all(&mut s);
        assert_eq!(again, (4..10).collect::<Vec<_>>());
        let m = {
            s.rewind();
            s.read_next().unwrap().unwrap()
        };
        assert_eq!(&*m.id, "h:cam:r:4");
        assert_eq!(&*m.message.source, "cam");
    }

    #[test]
    fn a_partial_last_line_is_cut_off_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        s.append(&msg(1), false).unwrap();
        s.close().unwrap();
        let seg = dir.path().join(segment_name(0));
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(br#"{"id":"half"#).unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(read_all(&mut s), vec![1]);
    }

    #[test]
    fn a_full_spool_drops_its_oldest_segment_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        // 64 KiB segments, 8 of them at most: ~65 bytes a record.
        let mut s = Spool::open(dir.path(), 8 * SEGMENT_MIN).unwrap();
        let mut lost = Lost::default();
        for f in 0..20_000 {
            lost.count += s.append(&msg(f), false).unwrap().0.count;
        }
        assert!(lost.count > 0);
        assert!(s.bytes <= 8 * SEGMENT_MIN, "{}", s.bytes);
        let kept = read_all(&mut s);
        assert_eq!(kept.len() as u64 + lost.count, 20_000);
        // The newest are kept, in order.
        assert_eq!(kept.first(), Some(&lost.count));
        assert_eq!(kept.last(), Some(&19_999));
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert!(files <= 8 + 2, "{files} files");
    }

    #[test]
    fn a_second_user_of_the_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Spool::open(dir.path(), 1 << 20).unwrap();
        let e = Spool::open(dir.path(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
    }

    #[test]
    fn a_drained_spool_leaves_no_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        s.append(&msg(1), false).unwrap();
        read_all(&mut s);
        s.commit_one().unwrap();
        s.close().unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().into_string().ok())
            .filter(|n| n.ends_with(".spool"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
