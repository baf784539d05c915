//! `GET /api/counts`: counts summed per bucket, oldest first, one page at a time.
//!
//! A page is read in the order of the `counts_minute` index (minute, then the series: source,
//! step, place, name), so SQLite hands rows over as it walks the index from where the page
//! starts and no query sorts or groups the whole store: the rows of one bucket are summed here
//! as they come, and the walk stops at the first row past the page. Its cursor is the last
//! row's bucket and series; the next page walks from that bucket's start (reading again at most
//! that one bucket's rows) and skips the series it gave. Rows added meanwhile after the cursor
//! (the writer adds to the current minute) are in a later page; those before it are not.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::params::{self as query, BadParam, QueryError, bucket};

/// The most count rows one page holds.
pub const MAX_COUNTS: u32 = 10_000;
/// Count rows in a page when `limit` is not given.
pub const DEFAULT_COUNTS: u32 = 1000;

/// One bucket of one count.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CountRow {
    pub source: String,
    pub step: String,
    pub place: String,
    /// `in`, `out`, `enter` or `leave`.
    pub name: String,
    /// The bucket's start, ms since the epoch (UTC).
    pub t: i64,
    pub n: i64,
}

/// A count's series: source, step, place and name, in the index's order.
type Series = (String, String, String, String);

/// Where a page ended: the bucket width it was summed by, the last row's bucket start and its
/// series. Sent to clients as an opaque `cursor` (`query::cursor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountCursor {
    bucket_ms: i64,
    t: i64,
    series: Series,
}

/// `GET /api/counts`'s filters and page.
#[derive(Debug, Clone, PartialEq)]
pub struct CountFilter {
    pub source: Option<String>,
    pub step: Option<String>,
    pub bucket_ms: i64,
    pub after: Option<i64>,
    pub before: Option<i64>,
    pub limit: u32,
    /// Only rows after this one (the next page).
    pub cursor: Option<CountCursor>,
}

impl CountFilter {
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, BadParam> {
        let mut f = Self {
            source: None,
            step: None,
            bucket_ms: bucket("")?,
            after: None,
            before: None,
            limit: DEFAULT_COUNTS,
            cursor: None,
        };
        for (k, v) in pairs {
            match k.as_str() {
                "source" => f.source = (!v.is_empty()).then(|| v.clone()),
                "step" => f.step = (!v.is_empty()).then(|| v.clone()),
                "bucket" => f.bucket_ms = bucket(v)?,
                "after" => f.after = query::time(k, v)?,
                "before" => f.before = query::time(k, v)?,
                "limit" => f.limit = query::limit(v, MAX_COUNTS)?,
                "cursor" if v.is_empty() => f.cursor = None,
                "cursor" => f.cursor = Some(query::from_cursor(v)?),
                other => {
                    return Err(BadParam(format!(
                        "unknown parameter \"{other}\": expected source, step, bucket, after, before, limit, cursor"
                    )));
                }
            }
        }
        if let Some(c) = &f.cursor
            && c.bucket_ms != f.bucket_ms
        {
            return Err(BadParam(
                "cursor is of a page of another bucket: keep the parameters of the first page"
                    .to_owned(),
            ));
        }
        Ok(f)
    }
}

/// A page of counts, and where the next one starts (`None`: this is the last).
#[derive(Debug, Clone, PartialEq)]
pub struct CountPage {
    pub rows: Vec<CountRow>,
    pub next: Option<CountCursor>,
}

/// The rows from a page's start on, in the index's order (see the module header).
const PAGE: &str =
    "SELECT minute, source, step, place, name, n FROM counts INDEXED BY counts_minute
    WHERE minute >= ?1 AND minute < ?2
      AND (?3 IS NULL OR source = ?3) AND (?4 IS NULL OR step = ?4)
    ORDER BY minute, source, step, place, name";

/// One page of counts summed per bucket, oldest first (then by series).
pub fn counts(path: &Path, f: &CountFilter) -> Result<CountPage, QueryError> {
    let Some(conn) = query::open(path)? else {
        return Ok(CountPage {
            rows: Vec::new(),
            next: None,
        });
    };
    let width = f.bucket_ms / 60_000;
    // Plain range bounds (never `?1 IS NULL OR ...`), so that SQLite seeks the index to them.
    let from = f.after.map(|a| a / 60_000).into_iter();
    let from = from
        .chain(f.cursor.as_ref().map(|c| c.t / 60_000))
        .max()
        .unwrap_or(i64::MIN);
    let to = f.before.map_or(i64::MAX, |b| b / 60_000);
    let mut stmt = conn.prepare_cached(PAGE)?;
    let mut rows = stmt.query(rusqlite::params![from, to, f.source, f.step])?;
    let mut page = Page {
        rows: Vec::new(),
        limit: f.limit as usize,
        after: f.cursor.as_ref(),
    };
    let mut open: Option<(i64, BTreeMap<Series, i64>)> = None;
    while let Some(r) = rows.next()? {
        let t = (r.get::<_, i64>(0)? / width) * width * 60_000;
        if let Some((done, sums)) = open.take_if(|(at, _)| *at != t) {
            // A row of a later bucket: the open one is whole, and any row of this one is past
            // what `add` took so far.
            if page.add(done, sums) || page.full() {
                return Ok(page.finish(f.bucket_ms, true));
            }
        }
        let series = (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        let n: i64 = r.get(5)?;
        *open
            .get_or_insert_with(|| (t, BTreeMap::new()))
            .1
            .entry(series)
            .or_default() += n;
    }
    let more = open.is_some_and(|(t, sums)| page.add(t, sums));
    Ok(page.finish(f.bucket_ms, more))
}

/// A page being filled, bucket by bucket.
struct Page<'a> {
    rows: Vec<CountRow>,
    limit: usize,
    /// The cursor the page starts after.
    after: Option<&'a CountCursor>,
}

impl Page<'_> {
    fn full(&self) -> bool {
        self.rows.len() >= self.limit
    }

    /// Adds a whole bucket's sums (those after the cursor); whether some did not fit.
    fn add(&mut self, t: i64, sums: BTreeMap<Series, i64>) -> bool {
        let after = self.after.filter(|c| c.t == t).map(|c| &c.series);
        let sums = sums
            .into_iter()
            .filter(|(series, _)| after.is_none_or(|a| series > a));
        for ((source, step, place, name), n) in sums {
            if self.full() {
                return true;
            }
            self.rows.push(CountRow {
                source,
                step,
                place,
                name,
                t,
                n,
            });
        }
        false
    }

    fn finish(self, bucket_ms: i64, more: bool) -> CountPage {
        let next = self.rows.last().filter(|_| more).map(|r| CountCursor {
            bucket_ms,
            t: r.t,
            series: (
                r.source.clone(),
                r.step.clone(),
                r.place.clone(),
                r.name.clone(),
            ),
        });
        CountPage {
            rows: self.rows,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_walks_the_minute_index_from_its_start_and_sorts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::schema::open_writer(&dir.path().join("e.db")).unwrap();
        for source in [None, Some("front")] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {PAGE}"))
                .unwrap()
                .query_map(rusqlite::params![5, 10, source, None::<String>], |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let plan = plan.join("; ");
            assert!(
                plan.contains("USING INDEX counts_minute (minute>? AND minute<?)"),
                "{plan}"
            );
            assert!(!plan.contains("TEMP B-TREE"), "{plan}");
        }
    }

    #[test]
    fn bad_limits_and_cursors_are_named_in_the_message() {
        let pairs = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        let bad = |k, v| CountFilter::from_pairs(&pairs(k, v)).unwrap_err().0;
        assert_eq!(bad("limit", "0"), "limit must be 1 to 10000, not 0");
        assert_eq!(bad("limit", "10001"), "limit must be 1 to 10000, not 10001");
        assert_eq!(bad("limit", "ten"), "limit \"ten\" is not a whole number");
        assert!(bad("cursor", "zz").starts_with("cursor \"zz\" is not one this API gave"));
        assert!(bad("bucket", "week").contains("bucket \"week\""));
        let hourly = CountCursor {
            bucket_ms: 3_600_000,
            t: 0,
            series: Default::default(),
        };
        let minute = vec![
            ("bucket".to_owned(), "minute".to_owned()),
            ("cursor".to_owned(), query::cursor(&hourly)),
        ];
        let e = CountFilter::from_pairs(&minute).unwrap_err().0;
        assert!(e.contains("another bucket"), "{e}");
        assert_eq!(CountFilter::from_pairs(&[]).unwrap().limit, DEFAULT_COUNTS);
    }
}
