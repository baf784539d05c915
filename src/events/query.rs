//! Reading the store, for the HTTP API: events newest first with filters, one event, counts by
//! bucket (`counts.rs`, paged), and what paged answers share: `limit` and the opaque `cursor`
//! of the next page. Each call opens its own read-only connection (cheap; WAL keeps it from blocking the
//! writer), so a store that was reopened or recreated is simply read as it is now.

use std::path::Path;

use rusqlite::params_from_iter;
use rusqlite::types::Value as Sql;
use serde::Serialize;

use super::params::{integer, open};

pub use super::counts::{
    CountCursor, CountFilter, CountPage, CountRow, DEFAULT_COUNTS, MAX_COUNTS, counts,
};
pub use super::params::{BadParam, QueryError, bucket, cursor, from_cursor, limit, time};

/// The most events one request returns.
pub const MAX_LIMIT: u32 = 1000;
/// Events returned when `limit` is not given.
pub const DEFAULT_LIMIT: u32 = 100;

/// `GET /api/events`'s filters.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct EventFilter {
    pub source: Option<String>,
    pub kind: Option<String>,
    pub label: Option<String>,
    /// A zone or line name.
    pub place: Option<String>,
    /// Start times, ms since the epoch: at or after, and before.
    pub after: Option<i64>,
    pub before: Option<i64>,
    /// Only events with a smaller id (the next page: the last id of this one).
    pub before_id: Option<i64>,
    pub limit: u32,
}

/// The kinds of event rows.
pub const KINDS: &[&str] = &[
    "track", "enter", "leave", "crossing", "loiter", "speeding", "motion",
];

impl EventFilter {
    /// From the query's pairs (already percent-decoded); unknown keys are refused, so a typo
    /// does not silently return everything.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, BadParam> {
        let mut f = Self {
            limit: DEFAULT_LIMIT,
            ..Self::default()
        };
        for (k, v) in pairs {
            let text = || (!v.is_empty()).then(|| v.clone());
            match k.as_str() {
                "source" => f.source = text(),
                "kind" => {
                    if !v.is_empty() && !KINDS.contains(&v.as_str()) {
                        return Err(BadParam(format!(
                            "kind \"{v}\" is not one of {}",
                            KINDS.join(", ")
                        )));
                    }
                    f.kind = text();
                }
                "label" => f.label = text(),
                "place" | "zone" | "line" => f.place = text(),
                "after" => f.after = time(k, v)?,
                "before" => f.before = time(k, v)?,
                "before_id" => f.before_id = Some(integer(k, v)?),
                "limit" => f.limit = limit(v, MAX_LIMIT)?,
                other => {
                    return Err(BadParam(format!(
                        "unknown parameter \"{other}\": expected source, kind, label, place, after, before, before_id, limit"
                    )));
                }
            }
        }
        Ok(f)
    }
}

/// One event, as the API returns it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventRow {
    pub id: i64,
    pub start: i64,
    pub end: i64,
    pub source: String,
    pub kind: String,
    pub label: String,
    pub track_id: Option<i64>,
    pub score: Option<f64>,
    pub step: String,
    pub place: Option<String>,
    pub direction: Option<String>,
    #[serde(rename = "box")]
    pub bbox: Option<serde_json::Value>,
    /// The files (paths as the sinks wrote them); the API adds their URLs.
    pub snapshot: Option<String>,
    pub clip: Option<String>,
    /// Seconds in its zone: a leave's whole visit, a loiter's or speeding's so far.
    pub dwell_s: Option<f64>,
    /// A speeding's speed, in `speed_unit` (`km/h`, or `px/s` on an uncalibrated camera).
    pub speed: Option<f64>,
    pub speed_unit: Option<String>,
}

const COLUMNS: &str = "id, start_ms, end_ms, source, kind, label, track_id, score, step, place, \
                       direction, box, snapshot, clip, dwell_s, speed, speed_unit";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
    let bbox: Option<String> = r.get(11)?;
    Ok(EventRow {
        id: r.get(0)?,
        start: r.get(1)?,
        end: r.get(2)?,
        source: r.get(3)?,
        kind: r.get(4)?,
        label: r.get(5)?,
        track_id: r.get(6)?,
        score: r.get(7)?,
        step: r.get(8)?,
        place: r.get(9)?,
        direction: r.get(10)?,
        bbox: bbox.and_then(|b| serde_json::from_str(&b).ok()),
        snapshot: r.get(12)?,
        clip: r.get(13)?,
        dwell_s: r.get(14)?,
        speed: r.get(15)?,
        speed_unit: r.get(16)?,
    })
}

/// Events matching `f`, newest first (by id: the order they were recorded in).
pub fn events(path: &Path, f: &EventFilter) -> Result<Vec<EventRow>, QueryError> {
    let Some(conn) = open(path)? else {
        return Ok(Vec::new());
    };
    let mut clauses = Vec::new();
    let mut args: Vec<Sql> = Vec::new();
    let mut add = |clause: &str, v: Sql| {
        args.push(v);
        clauses.push(format!("{clause} ?{}", args.len()));
    };
    if let Some(v) = &f.source {
        add("source =", Sql::Text(v.clone()));
    }
    if let Some(v) = &f.kind {
        add("kind =", Sql::Text(v.clone()));
    }
    if let Some(v) = &f.label {
        add("label =", Sql::Text(v.clone()));
    }
    if let Some(v) = &f.place {
        add("place =", Sql::Text(v.clone()));
    }
    if let Some(v) = f.after {
        add("start_ms >=", Sql::Integer(v));
    }
    if let Some(v) = f.before {
        add("start_ms <", Sql::Integer(v));
    }
    if let Some(v) = f.before_id {
        add("id <", Sql::Integer(v));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM events {filter} ORDER BY id DESC LIMIT {}",
        f.limit
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt
        .query_map(params_from_iter(args), row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// One event, if it exists.
pub fn event(path: &Path, id: i64) -> Result<Option<EventRow>, QueryError> {
    let Some(conn) = open(path)? else {
        return Ok(None);
    };
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM events WHERE id = ?1"))?;
    let mut rows = stmt.query_map([id], row)?;
    Ok(rows.next().transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn bad_parameters_are_named_in_the_message() {
        let e = EventFilter::from_pairs(&pairs(&[("limit", "0")])).unwrap_err();
        assert_eq!(e.0, "limit must be 1 to 1000, not 0");
        let e = EventFilter::from_pairs(&pairs(&[("after", "yesterday")])).unwrap_err();
        assert!(e.0.starts_with("after \"yesterday\" is not a time"), "{e}");
        let e = EventFilter::from_pairs(&pairs(&[("kind", "walk")])).unwrap_err();
        assert!(e.0.contains("kind \"walk\""), "{e}");
        let e = EventFilter::from_pairs(&pairs(&[("lable", "person")])).unwrap_err();
        assert!(e.0.contains("unknown parameter \"lable\""), "{e}");
        let f = EventFilter::from_pairs(&pairs(&[
            ("after", "2026-12-03T09:00:00Z"),
            ("label", "person"),
        ]))
        .unwrap();
        assert_eq!(f.after, Some(1_796_288_400_000));
        assert_eq!(f.label.as_deref(), Some("person"));
    }

    #[test]
    fn a_store_not_yet_made_or_without_its_tables_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let all = EventFilter {
            limit: DEFAULT_LIMIT,
            ..EventFilter::default()
        };
        let by_bucket = CountFilter::from_pairs(&[]).unwrap();
        assert!(events(&path, &all).unwrap().is_empty());
        assert!(counts(&path, &by_bucket).unwrap().rows.is_empty());
        assert!(event(&path, 1).unwrap().is_none());
        // As the writer leaves it between opening the file and making its tables.
        let made = rusqlite::Connection::open(&path).unwrap();
        made.pragma_update(None, "journal_mode", "wal").unwrap();
        assert!(events(&path, &all).unwrap().is_empty());
        assert!(counts(&path, &by_bucket).unwrap().rows.is_empty());
        assert!(event(&path, 1).unwrap().is_none());
        // A file that is not a database is still an error, not an empty store.
        drop(made);
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        assert!(events(&path, &all).is_err());
    }
}
