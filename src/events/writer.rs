//! The writer thread, `vidflow-events` (see the module above): batches of facts in one
//! transaction each, at their frames' times (`time.rs`), tracks and motion kept open in memory
//! and closed by their sources' frame time, snapshots and clips named once the sinks that
//! trigger on an event made them for its frame (`link.rs`), old rows deleted, and a failing
//! database reopened.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use rusqlite::{Connection, Transaction, params};

use super::heat::{Areas, MAX_STEP};
use super::identity::{self, FileId};
use super::link::{self, Pending};
use super::schema;
use super::time::Clocks;
use super::{Counters, EventsConfig, Facts, Msg, millis};
use crate::storage::{Class, Storage};
use crate::value::{BBox, EventKind, Speed};

/// How often recent events get their snapshot and clip named (and the thread wakes when idle).
pub(super) const LINK_INTERVAL: Duration = Duration::from_secs(2);
/// How long after a failure the database is opened again.
pub(super) const REOPEN_DELAY: Duration = Duration::from_secs(5);
/// Frames of facts written in one transaction at most.
const BATCH: usize = 256;
/// A track not seen for this long of its source's frame time has ended (its row's end is its
/// last sighting).
const TRACK_GONE: Duration = Duration::from_secs(3);
/// Frames without motion for this long (frame time) end a stretch of motion.
const MOTION_GAP: Duration = Duration::from_secs(3);
/// Events written longer ago than this are no longer given a snapshot or clip (their files
/// came or never will: a clip is finished `post_roll_s` after its last trigger, and at most
/// `max_clip_s` long).
const LINK_WINDOW: Duration = Duration::from_secs(600);
/// How often old rows are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// A track or stretch of motion still going on: its row and when it was last seen.
#[derive(Debug)]
struct Open {
    row: i64,
    /// The row's `start_ms`: with its id and source, how a reopened file is known to hold it.
    start: i64,
    last: i64,
    score: f64,
    dirty: bool,
}

/// A test's hook, given the database's path.
#[cfg(test)]
pub(super) type Hook = Box<dyn FnMut(&Path) + Send>;

/// Open tracks by source, step and track id.
type Tracks = HashMap<(Arc<str>, Arc<str>, u64), Open>;
/// Open stretches of motion by source and step.
type Motion = HashMap<(Arc<str>, Arc<str>), Open>;

pub(super) struct Writer {
    config: EventsConfig,
    storage: Storage,
    counters: Arc<Counters>,
    conn: Option<Connection>,
    /// The file `conn` has open (device, inode), read from its descriptor (`identity.rs`):
    /// another file at the path, or none, is not it.
    file: Option<FileId>,
    /// When the database last failed (it is reopened [`REOPEN_DELAY`] later).
    failed_at: Option<Instant>,
    /// A failure was logged (the next ones are counted only).
    said: bool,
    tracks: Tracks,
    motion: Motion,
    /// Events to be given their snapshot and clip (`link.rs`), in rows of the open file.
    pending: Vec<Pending>,
    /// Each source's frame time (rows' times, and what ends tracks and motion).
    clocks: Clocks,
    /// Each source's last stream time (s): a frame's time step starts there.
    stepped: HashMap<Arc<str>, f64>,
    /// What the batch adds to occupancy and heatmaps.
    areas: Areas,
    linked_at: Instant,
    retained_at: Option<Instant>,
    /// Runs just before a batch's commit: a test's way into the window between the check of
    /// the file and the commit.
    #[cfg(test)]
    pub(super) before_commit: Option<Hook>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("path", &self.config.path)
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub(super) fn new(config: EventsConfig, storage: Storage, counters: Arc<Counters>) -> Self {
        Self {
            config,
            storage,
            counters,
            conn: None,
            file: None,
            failed_at: None,
            said: false,
            tracks: HashMap::new(),
            motion: HashMap::new(),
            pending: Vec::new(),
            clocks: Clocks::default(),
            stepped: HashMap::new(),
            areas: Areas::default(),
            linked_at: Instant::now(),
            retained_at: None,
            #[cfg(test)]
            before_commit: None,
        }
    }

    /// Until `Stop` (or every sender gone): batches, links, retention.
    pub(super) fn run(mut self, rx: &Receiver<Msg>) {
        self.connect();
        let mut stop = false;
        while !stop {
            let mut batch = Vec::new();
            match rx.recv_timeout(LINK_INTERVAL) {
                Ok(Msg::Facts(f)) => batch.push(f),
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
            while !stop && batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(Msg::Facts(f)) => batch.push(f),
                    Ok(Msg::Stop) => stop = true,
                    Err(_) => break,
                }
            }
            self.write(&batch, stop);
            if stop || self.linked_at.elapsed() >= LINK_INTERVAL {
                self.linked_at = Instant::now();
                self.check_file();
                self.link();
            }
            if self
                .retained_at
                .is_none_or(|at| at.elapsed() >= RETENTION_INTERVAL)
            {
                self.retained_at = Some(Instant::now());
                self.retain();
            }
        }
    }

    /// Opens the database (setting a corrupt one aside first); a failure is counted.
    pub(super) fn connect(&mut self) {
        let path = self.config.path.clone();
        let path = &path;
        let mut before = identity::descriptors();
        let opened = match schema::open_writer(path) {
            Err(e) if e.is_corrupt() => {
                let aside = set_aside(path);
                self.fail(&format!(
                    "is damaged ({e}); set aside as {} and recreated",
                    aside.display()
                ));
                before = identity::descriptors();
                schema::open_writer(path)
            }
            other => other,
        };
        match opened {
            Ok(conn) => self.adopt(conn, &before),
            Err(e) => self.fail(&e.to_string()),
        }
    }

    /// Writes into `conn`, just opened (`before`: the descriptors open before it), once the
    /// file it opened is known by its descriptor (`identity.rs`).
    pub(super) fn adopt(&mut self, conn: Connection, before: &identity::Descriptors) {
        let path = self.config.path.clone();
        let Some(file) = identity::opened(before, &path) else {
            self.fail("cannot tell which file the database connection opened");
            return;
        };
        if self.failed_at.take().is_some() {
            self.counters.reopened.fetch_add(1, Ordering::Relaxed);
            tracing::info!(path = %path.display(), "event store: database open again");
        }
        self.file = Some(file);
        self.keep_rows_of(&conn);
        self.conn = Some(conn);
    }

    /// Tracks open now (a test's view of what ended).
    #[cfg(test)]
    pub(super) fn open_tracks(&self) -> usize {
        self.tracks.len()
    }

    /// Whether the file at the path is still the one the connection has open.
    fn still_ours(&self) -> bool {
        identity::at(&self.config.path) == self.file
    }

    /// Counts a failure, says the first one, and drops the connection until [`REOPEN_DELAY`].
    fn fail(&mut self, why: &str) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        if self.said {
            tracing::debug!(path = %self.config.path.display(), "event store: {why}");
        } else {
            self.said = true;
            tracing::warn!(path = %self.config.path.display(), "event store: {why}; frames go on, events are counted as dropped until it opens again (said once)");
        }
        self.conn = None;
        self.failed_at = Some(Instant::now());
    }

    /// A file deleted, moved or replaced under the open connection is written no more:
    /// reopened. (While the connection holds the old file open, no other file can have its
    /// device and inode.)
    fn check_file(&mut self) {
        if self.conn.is_some() && !self.still_ours() {
            self.let_go("the database file is gone (deleted, moved or replaced)");
        }
    }

    /// Lets go of a file no longer at the path, to open the one there at once. Its WAL is
    /// emptied into it first: the WAL is named by the path, and SQLite does not checkpoint a
    /// moved file on close, so the file opened next at the path would take its pages for its
    /// own.
    fn let_go(&mut self, why: &str) {
        if let Some(conn) = self.conn.as_ref()
            && let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::debug!(path = %self.config.path.display(), error = %e, "event store: cannot empty the WAL of the file let go");
        }
        self.fail(why);
        self.failed_at = Some(Instant::now() - REOPEN_DELAY);
    }

    /// Keeps only the open rows that the file `conn` has open holds: after a reconnection it
    /// may be another file (made again, restored) whose row ids are other rows. Those not
    /// there start a row again when next seen.
    fn keep_rows_of(&mut self, conn: &Connection) {
        let tracks = self.tracks.iter().map(|(k, o)| (&k.0, o));
        let motion = self.motion.iter().map(|(k, o)| (&k.0, o));
        let gone: Vec<i64> = tracks
            .chain(motion)
            .filter(|(source, o)| !holds(conn, o.row, o.start, source))
            .map(|(_, o)| o.row)
            .collect();
        self.tracks.retain(|_, o| !gone.contains(&o.row));
        self.motion.retain(|_, o| !gone.contains(&o.row));
        self.pending
            .retain(|p| holds(conn, p.row, p.start, &p.source));
    }

    pub(super) fn write(&mut self, batch: &[Facts], last: bool) {
        // A `stat`: rows are not written into a file deleted since the last batch.
        self.check_file();
        if self.conn.is_none()
            && self
                .failed_at
                .is_some_and(|at| at.elapsed() >= REOPEN_DELAY)
        {
            self.connect();
        }
        // Frame times are given whether the database takes the rows or not: a source's time
        // goes on.
        let times: Vec<i64> = batch
            .iter()
            .map(|f| self.clocks.place(&f.source, &f.time))
            .collect();
        let steps: Vec<f64> = batch.iter().map(|f| self.step(f)).collect();
        let with_facts = batch.iter().filter(|f| !f.is_empty()).count() as u64;
        let Some(conn) = self.conn.as_mut() else {
            self.counters
                .dropped
                .fetch_add(with_facts, Ordering::Relaxed);
            return;
        };
        let clocks = &self.clocks;
        let mut pending = Vec::new();
        let result = (|| -> rusqlite::Result<u64> {
            let tx = conn.transaction()?;
            let mut rows = 0;
            for ((facts, &at), &dt) in batch.iter().zip(&times).zip(&steps) {
                let open = (&mut self.tracks, &mut self.motion);
                rows += apply(&tx, facts, at, open, &mut pending)?;
                self.areas.add(&tx, facts, at, dt);
            }
            self.areas.write(&tx)?;
            let now = |source: &str| clocks.now(source).unwrap_or(i64::MIN);
            close_open(&tx, &mut self.tracks, |k| now(&k.0), TRACK_GONE, last)?;
            close_open(&tx, &mut self.motion, |k| now(&k.0), MOTION_GAP, last)?;
            #[cfg(test)]
            if let Some(hook) = self.before_commit.as_mut() {
                hook(&self.config.path);
            }
            tx.commit()?;
            Ok(rows)
        })();
        match result {
            // Committed into a file that was deleted or replaced since the check above: the
            // batch is in no file anyone reads. Dropped, and the file at the path opened now
            // (what the batch opened is not there: `keep_rows_of` forgets it).
            Ok(_) if !self.still_ours() => {
                self.counters
                    .dropped
                    .fetch_add(with_facts, Ordering::Relaxed);
                self.let_go("the database file was replaced while a batch was written; the batch is dropped");
                self.connect();
            }
            Ok(rows) => {
                self.counters.events.fetch_add(rows, Ordering::Relaxed);
                self.pending.append(&mut pending);
            }
            Err(e) => {
                self.areas.clear();
                self.counters
                    .dropped
                    .fetch_add(with_facts, Ordering::Relaxed);
                let corrupt = schema::is_corrupt(&e);
                self.fail(&format!("cannot write: {e}"));
                if corrupt {
                    set_aside(&self.config.path);
                }
                // What the rolled-back transaction opened is not in the file: reopening keeps
                // only the rows it holds (`keep_rows_of`).
            }
        }
    }

    /// The time step of a frame (s): since its source's previous facts in stream time, or,
    /// for a first frame, one whose time went back or came after a gap of more than
    /// [`MAX_STEP`], its nominal interval (at most `MAX_STEP`).
    fn step(&mut self, f: &Facts) -> f64 {
        let last = self.stepped.insert(f.source.clone(), f.stream_s);
        match last.map(|l| f.stream_s - l) {
            Some(d) if d > 0.0 && d <= MAX_STEP => d,
            _ => f.interval_s.min(MAX_STEP),
        }
    }

    /// Names the snapshot and clip of recent events that have none yet (`link.rs`).
    fn link(&mut self) {
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        self.pending.retain(|p| p.since.elapsed() < LINK_WINDOW);
        if self.pending.is_empty() {
            return;
        }
        let files = self.storage.files(Some(Class::Event));
        if let Err(e) = link::link(conn, &files, &mut self.pending) {
            self.fail(&format!("cannot name snapshots and clips: {e}"));
        }
    }

    /// Deletes rows older than `retain_days`.
    fn retain(&mut self) {
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        let before = millis(SystemTime::now()) - self.config.retain.as_millis() as i64;
        let result = conn
            .execute("DELETE FROM events WHERE end_ms < ?1", [before])
            .and_then(|_| {
                let minute = before.div_euclid(60_000);
                conn.execute("DELETE FROM counts WHERE minute < ?1", [minute])?;
                conn.execute("DELETE FROM occupancy WHERE minute < ?1", [minute])?;
                conn.execute("DELETE FROM heatmap WHERE minute < ?1", [minute])
            });
        if let Err(e) = result {
            self.fail(&format!("cannot delete old rows: {e}"));
        }
    }
}

/// A new row, at one instant.
const INSERT: &str =
    "INSERT INTO events (start_ms, end_ms, source, kind, label, track_id, score, step, place,
     direction, box, dwell_s, speed, speed_unit)
     VALUES (?1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";

/// Writes one frame's facts; returns the rows added.
fn apply(
    tx: &Transaction<'_>,
    facts: &Facts,
    at: i64,
    (tracks, motion): (&mut Tracks, &mut Motion),
    pending: &mut Vec<Pending>,
) -> rusqlite::Result<u64> {
    let source = &facts.source;
    let mut rows = 0;
    let mut insert = tx.prepare_cached(INSERT)?;
    for (step, list, _) in &facts.tracks {
        for t in list.iter().filter(|t| !t.predicted) {
            let score = f64::from(t.detection.confidence);
            let key = (source.clone(), step.clone(), t.track_id);
            if let Some(open) = tracks.get_mut(&key) {
                if seen_since(open, at, TRACK_GONE) {
                    open.last = at;
                    open.score = open.score.max(score);
                    open.dirty = true;
                    continue;
                }
                // Unseen for longer (its frames came in this batch): its row ended.
                flush(tx, open)?;
            }
            insert.execute(params![
                at,
                &**source,
                "track",
                &*t.detection.class,
                t.track_id as i64,
                score,
                &**step,
                None::<&str>,
                None::<&str>,
                box_json(&t.detection.bbox),
                None::<f64>,
                None::<f64>,
                None::<&str>,
            ])?;
            rows += 1;
            let row = tx.last_insert_rowid();
            tracks.insert(
                key,
                Open {
                    row,
                    start: at,
                    last: at,
                    score,
                    dirty: false,
                },
            );
        }
    }
    rows += apply_events(tx, facts, at, pending)?;
    rows += apply_motion(tx, facts, at, motion)?;
    Ok(rows)
}

/// Writes one frame's zone and line events and counts them; returns the rows added. Those
/// that sinks make files for are added to `pending`, to be linked to them.
fn apply_events(
    tx: &Transaction<'_>,
    facts: &Facts,
    at: i64,
    pending: &mut Vec<Pending>,
) -> rusqlite::Result<u64> {
    let source = &facts.source;
    let mut rows = 0;
    let mut count = tx.prepare_cached(
        "INSERT INTO counts (source, step, place, name, minute, n) VALUES (?1, ?2, ?3, ?4, ?5, 1)
         ON CONFLICT (source, step, place, name, minute) DO UPDATE SET n = n + 1",
    )?;
    for (step, list, sinks) in &facts.events {
        for e in list.iter() {
            let (kind, direction) = match e.event {
                EventKind::Enter => ("enter", None),
                EventKind::Leave => ("leave", None),
                EventKind::In => ("crossing", Some("in")),
                EventKind::Out => ("crossing", Some("out")),
                EventKind::Loiter => ("loiter", None),
                EventKind::Speeding => ("speeding", None),
                EventKind::Ended => continue,
            };
            tx.prepare_cached(INSERT)?.execute(params![
                at,
                &**source,
                kind,
                &*e.class,
                e.track_id as i64,
                None::<f64>,
                &**step,
                &*e.place,
                direction,
                box_json(&e.bbox),
                e.dwell_s.map(f64::from),
                e.speed.map(|v| f64::from(v.value())),
                e.speed.map(Speed::unit),
            ])?;
            rows += 1;
            if !sinks.is_empty() {
                pending.push(Pending {
                    row: tx.last_insert_rowid(),
                    start: at,
                    source: source.clone(),
                    frame: facts.seq,
                    track: e.track_id,
                    sinks: sinks.clone(),
                    since: Instant::now(),
                    snapshot: false,
                    clip: false,
                });
            }
            count.execute(params![
                &**source,
                &**step,
                &*e.place,
                direction.unwrap_or(kind),
                at.div_euclid(60_000),
            ])?;
        }
    }
    Ok(rows)
}

/// Writes one frame's motion: a row per stretch; returns the rows added.
fn apply_motion(
    tx: &Transaction<'_>,
    facts: &Facts,
    at: i64,
    motion: &mut HashMap<(Arc<str>, Arc<str>), Open>,
) -> rusqlite::Result<u64> {
    let source = &facts.source;
    let mut rows = 0;
    for step in &facts.motion {
        let key = (source.clone(), step.clone());
        if let Some(open) = motion.get_mut(&key) {
            if seen_since(open, at, MOTION_GAP) {
                open.last = at;
                open.dirty = true;
                continue;
            }
            flush(tx, open)?;
        }
        tx.prepare_cached(INSERT)?.execute(params![
            at,
            &**source,
            "motion",
            "motion",
            None::<i64>,
            None::<f64>,
            &**step,
            None::<&str>,
            None::<&str>,
            None::<String>,
            None::<f64>,
            None::<f64>,
            None::<&str>,
        ])?;
        rows += 1;
        let row = tx.last_insert_rowid();
        motion.insert(
            key,
            Open {
                row,
                start: at,
                last: at,
                score: 0.0,
                dirty: false,
            },
        );
    }
    Ok(rows)
}

/// Writes the end (and best score) of open rows that moved; closes those unseen for `gone` of
/// their source's frame time, `now` (every one when `all`).
fn close_open<K: std::hash::Hash + Eq>(
    tx: &Transaction<'_>,
    open: &mut HashMap<K, Open>,
    now: impl Fn(&K) -> i64,
    gone: Duration,
    all: bool,
) -> rusqlite::Result<()> {
    for o in open.values_mut() {
        flush(tx, o)?;
    }
    open.retain(|k, o| !all && seen_since(o, now(k), gone));
    Ok(())
}

/// Whether `open` was seen within `gone` before `now` (frame times).
fn seen_since(open: &Open, now: i64, gone: Duration) -> bool {
    open.last >= now.saturating_sub(gone.as_millis() as i64)
}

/// Writes the end (and best score) of `open`'s row if it moved.
fn flush(tx: &Transaction<'_>, open: &mut Open) -> rusqlite::Result<()> {
    if open.dirty {
        tx.prepare_cached(
            "UPDATE events SET end_ms = ?1, score = CASE WHEN score IS NULL THEN NULL ELSE ?2 END
             WHERE id = ?3",
        )?
        .execute(params![open.last, open.score, open.row])?;
        open.dirty = false;
    }
    Ok(())
}

/// Whether the file of `conn` holds row `row`, with its start and source.
fn holds(conn: &Connection, row: i64, start: i64, source: &str) -> bool {
    conn.query_row(
        "SELECT 1 FROM events WHERE id = ?1 AND start_ms = ?2 AND source = ?3",
        params![row, start, source],
        |_| Ok(()),
    )
    .is_ok()
}

fn box_json(b: &BBox) -> String {
    format!("[{:.1},{:.1},{:.1},{:.1}]", b.x, b.y, b.width, b.height)
}

/// Renames a damaged database (and its WAL) to `NAME.corrupt-MS`: nothing is destroyed.
fn set_aside(path: &Path) -> PathBuf {
    let stamp = millis(SystemTime::now());
    let aside = PathBuf::from(format!("{}.corrupt-{stamp}", path.display()));
    if let Err(e) = std::fs::rename(path, &aside) {
        tracing::warn!(path = %path.display(), error = %e, "event store: cannot set the damaged database aside");
    }
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", path.display()));
        if side.exists() {
            let _ = std::fs::rename(&side, format!("{}{suffix}", aside.display()));
        }
    }
    aside
}
