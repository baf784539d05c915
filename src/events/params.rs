//! What the store's readers share: a query parameter that cannot be taken ([`BadParam`]),
//! why a query failed, the parameters every answer reads the same way (times, `limit`,
//! `bucket`, the opaque `cursor` of a next page) and the read-only connection of one request.
//! Apart from `query.rs` (events) and the answers of their own (`counts.rs`, `zones.rs`), which
//! all import it and none another.

use std::path::Path;

use base64::Engine as _;
use rusqlite::Connection;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::schema;

/// A query parameter that cannot be taken: the 400's message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadParam(pub String);

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    Bad(#[from] BadParam),
    #[error("event store unavailable: {0}")]
    Store(#[from] rusqlite::Error),
}

/// A time parameter: ms since the epoch, or RFC 3339 (`2026-12-03T09:00:00Z`).
pub fn time(key: &str, v: &str) -> Result<Option<i64>, BadParam> {
    if v.is_empty() {
        return Ok(None);
    }
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(Some(ms));
    }
    humantime::parse_rfc3339_weak(v)
        .map(|t| Some(super::millis(t)))
        .map_err(|_| {
            BadParam(format!(
                "{key} \"{v}\" is not a time: give ms since 1970 or RFC 3339 (2026-12-03T09:00:00Z)"
            ))
        })
}

pub(super) fn integer(key: &str, v: &str) -> Result<i64, BadParam> {
    v.parse()
        .map_err(|_| BadParam(format!("{key} \"{v}\" is not a whole number")))
}

/// A `limit` parameter: a whole number from 1 to `max`.
pub fn limit(v: &str, max: u32) -> Result<u32, BadParam> {
    let n = integer("limit", v)?;
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| BadParam(format!("limit must be 1 to {max}, not {n}")))
}

/// The opaque `cursor` of a next page: where the last page ended (its key, as JSON, in
/// URL-safe base64, so that it goes into a query without escaping).
pub fn cursor<T: Serialize>(key: &T) -> String {
    let json = serde_json::to_vec(key).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A `cursor` parameter back into the key it was made from.
pub fn from_cursor<T: DeserializeOwned>(v: &str) -> Result<T, BadParam> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(v)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or_else(|| {
            BadParam(format!(
                "cursor \"{v}\" is not one this API gave: pass the `next` of the page before, or no cursor for the first page"
            ))
        })
}

/// A bucket's width for `GET /api/counts`.
pub fn bucket(v: &str) -> Result<i64, BadParam> {
    match v {
        "" | "hour" => Ok(3_600_000),
        "minute" => Ok(60_000),
        "day" => Ok(86_400_000),
        other => Err(BadParam(format!(
            "bucket \"{other}\" is not one of minute, hour, day"
        ))),
    }
}

/// The store read-only, or `None` while it holds nothing yet: its file not made, or made and
/// its tables not yet, or not yet migrated (the writer opens it in its own thread, while the
/// API already answers; and makes it again after it was deleted). Read as empty, not as
/// unavailable.
pub(super) fn open(path: &Path) -> rusqlite::Result<Option<Connection>> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = schema::open_reader(path)?;
    let version: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    // Older: the writer has not brought it up to date yet (it does on opening).
    Ok((version >= schema::VERSION).then_some(conn))
}
