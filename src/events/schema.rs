//! The database's layout and its migrations. `PRAGMA user_version` is the schema version: the
//! number of [`MIGRATIONS`] applied. Opening runs the missing ones in one transaction each, so
//! a database of an older vidflow is brought up to date and one of a newer vidflow is refused
//! (never written in a layout this build does not know).
//!
//! - 1: `events` (a row per track, zone enter and leave, crossing, stretch of motion) and
//!   `counts` (per source, step, place, name and minute).
//! - 2: `events.dwell_s`, `speed`, `speed_unit` (`km/h` or `px/s`); `occupancy` (per source,
//!   step, zone and minute: objects inside times seconds, the seconds seen, the most inside at
//!   once); `heatmap` (per source, label and minute: seconds objects stood in each cell of a
//!   [`crate::events::heat::COLS`] x `ROWS` grid over the picture, `heat::encode`'s sparse
//!   blob).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How long a statement waits for another connection's lock (a reader's checkpoint, a second
/// process) before it fails with "database is locked".
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// Each migration brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[MIGRATION_1, MIGRATION_2];

/// 1: events and counts per minute.
pub(super) const MIGRATION_1: &str = "CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        start_ms INTEGER NOT NULL,
        end_ms INTEGER NOT NULL,
        source TEXT NOT NULL,
        kind TEXT NOT NULL,
        label TEXT NOT NULL DEFAULT '',
        track_id INTEGER,
        score REAL,
        step TEXT NOT NULL DEFAULT '',
        place TEXT,
        direction TEXT,
        box TEXT,
        snapshot TEXT,
        clip TEXT
    );
    CREATE INDEX events_start ON events (start_ms);
    CREATE INDEX events_source ON events (source, id);
    CREATE INDEX events_kind ON events (kind, id);
    CREATE INDEX events_label ON events (label, id);
    CREATE TABLE counts (
        source TEXT NOT NULL,
        step TEXT NOT NULL,
        place TEXT NOT NULL,
        name TEXT NOT NULL,
        minute INTEGER NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (source, step, place, name, minute)
    ) WITHOUT ROWID;
    CREATE INDEX counts_minute ON counts (minute);";

/// 2: how long and how fast (a leave's visit, a loiter's and a speeding's dwell, a
/// speeding's speed), occupancy of zones per minute, and where objects were (heatmaps).
const MIGRATION_2: &str = "ALTER TABLE events ADD COLUMN dwell_s REAL;
    ALTER TABLE events ADD COLUMN speed REAL;
    ALTER TABLE events ADD COLUMN speed_unit TEXT;
    CREATE INDEX events_kind_start ON events (kind, start_ms);
    CREATE TABLE occupancy (
        source TEXT NOT NULL,
        step TEXT NOT NULL,
        place TEXT NOT NULL,
        minute INTEGER NOT NULL,
        object_s REAL NOT NULL,
        seconds REAL NOT NULL,
        max INTEGER NOT NULL,
        PRIMARY KEY (source, step, place, minute)
    ) WITHOUT ROWID;
    CREATE INDEX occupancy_minute ON occupancy (minute);
    CREATE TABLE heatmap (
        source TEXT NOT NULL,
        label TEXT NOT NULL,
        minute INTEGER NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        cells BLOB NOT NULL,
        PRIMARY KEY (source, label, minute)
    ) WITHOUT ROWID;
    CREATE INDEX heatmap_minute ON heatmap (minute);";

/// The schema version this build writes.
pub const VERSION: u32 = MIGRATIONS.len() as u32;

/// Why the database could not be opened for writing.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot create its folder: {0}")]
    Folder(std::io::Error),
    #[error("its schema is version {found}, newer than this vidflow's {VERSION}")]
    Newer { found: u32 },
}

impl SchemaError {
    /// Whether the file is not a database, or a damaged one: it is set aside and recreated.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Sqlite(e) if is_corrupt(e))
    }
}

/// Whether SQLite says the file is damaged or not a database.
pub fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// Opens (creating) the database for the writer: WAL, its schema brought up to date.
pub fn open_writer(path: &Path) -> Result<Connection, SchemaError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(SchemaError::Folder)?;
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers (the API) never block the writer, nor it them. NORMAL: a crash may lose the
    // last transactions, never corrupt the file.
    conn.pragma_update(None, "journal_mode", "wal")?;
    conn.pragma_update(None, "synchronous", "normal")?;
    migrate(&conn)?;
    Ok(conn)
}

/// Opens the database read-only, for one API request.
pub fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

fn migrate(conn: &Connection) -> Result<(), SchemaError> {
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > VERSION {
        return Err(SchemaError::Newer { found });
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_gets_every_migration_and_reopening_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let conn = open_writer(&path).unwrap();
        let v: u32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, VERSION);
        conn.execute(
            "INSERT INTO events (start_ms, end_ms, source, kind) VALUES (1, 1, 'a', 'track')",
            [],
        )
        .unwrap();
        drop(conn);
        let conn = open_writer(&path).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_newer_schema_is_refused_and_a_damaged_file_is_said_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", VERSION + 1)
            .unwrap();
        drop(conn);
        let e = open_writer(&path).unwrap_err();
        assert!(matches!(e, SchemaError::Newer { .. }), "{e}");
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![b'x'; 8192]).unwrap();
        let e = open_writer(&junk).unwrap_err();
        assert!(e.is_corrupt(), "{e}");
    }
}
