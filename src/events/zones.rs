//! `GET /api/counts/zones` and `GET /api/heatmap`: how many waited in each zone and how long,
//! and where objects were.
//!
//! Zones: per source, step, zone and bucket, the zone's `enter` and `leave` events (a leave
//! with its visit's `dwell_s` is a visit), its `loiter` and `speeding` events, the dwell's
//! mean, median, 90th percentile and maximum over its visits, and the objects inside
//! (time-weighted mean and most at once, from `occupancy`). Read from the `events_kind_start`
//! and `occupancy_minute` indexes over the time asked, summed here; not paged: give `after`
//! and `before` (or `bucket=day`) for a long span.
//!
//! Heatmap: a source's (and label's) `heatmap` rows over the time asked, summed cell by cell.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::heat::{self, COLS, Cells, ROWS};
use super::params::{self as query, BadParam, QueryError};

/// `GET /api/counts/zones`'s filters.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneFilter {
    pub source: Option<String>,
    pub step: Option<String>,
    pub place: Option<String>,
    pub bucket_ms: i64,
    pub after: Option<i64>,
    pub before: Option<i64>,
}

impl ZoneFilter {
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, BadParam> {
        let mut f = Self {
            source: None,
            step: None,
            place: None,
            bucket_ms: query::bucket("")?,
            after: None,
            before: None,
        };
        for (k, v) in pairs {
            let text = || (!v.is_empty()).then(|| v.clone());
            match k.as_str() {
                "source" => f.source = text(),
                "step" => f.step = text(),
                "place" => f.place = text(),
                "bucket" => f.bucket_ms = query::bucket(v)?,
                "after" => f.after = query::time(k, v)?,
                "before" => f.before = query::time(k, v)?,
                other => {
                    return Err(BadParam(format!(
                        "unknown parameter \"{other}\": expected source, step, place, bucket, after, before"
                    )));
                }
            }
        }
        Ok(f)
    }
}

/// Dwell times of a zone's visits in a bucket, seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Dwell {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

/// Objects inside a zone in a bucket: time-weighted mean, and most at once.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Occupancy {
    pub mean: f64,
    pub max: i64,
}

/// One zone in one bucket.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ZoneRow {
    pub source: String,
    pub step: String,
    pub place: String,
    /// The bucket's start, ms since the epoch (UTC).
    pub t: i64,
    pub enters: i64,
    pub leaves: i64,
    /// Leaves that know how long their visit lasted.
    pub visits: i64,
    /// Over the visits; `null` without any.
    pub dwell_s: Option<Dwell>,
    pub loiter: i64,
    pub speeding: i64,
    /// `null` where no frame was counted.
    pub occupancy: Option<Occupancy>,
}

/// What a bucket of a zone gathers.
#[derive(Debug, Default)]
struct Gathered {
    enters: i64,
    leaves: i64,
    loiter: i64,
    speeding: i64,
    dwell: Vec<f64>,
    object_s: f64,
    seconds: f64,
    max: Option<i64>,
}

type Key = (i64, String, String, String);

/// The zones' rows, oldest bucket first, then by source, step and zone.
pub fn zones(path: &Path, f: &ZoneFilter) -> Result<Vec<ZoneRow>, QueryError> {
    let Some(conn) = query::open(path)? else {
        return Ok(Vec::new());
    };
    let (from, to) = (f.after.unwrap_or(i64::MIN), f.before.unwrap_or(i64::MAX));
    let bucket = |ms: i64| ms.div_euclid(f.bucket_ms) * f.bucket_ms;
    let mut all: BTreeMap<Key, Gathered> = BTreeMap::new();
    let args = rusqlite::params![from, to, f.source, f.step, f.place];
    let mut stmt = conn.prepare_cached(
        "SELECT start_ms, source, step, place, kind, dwell_s FROM events
         WHERE kind IN ('enter', 'leave', 'loiter', 'speeding') AND place IS NOT NULL
           AND start_ms >= ?1 AND start_ms < ?2
           AND (?3 IS NULL OR source = ?3) AND (?4 IS NULL OR step = ?4)
           AND (?5 IS NULL OR place = ?5)",
    )?;
    let mut rows = stmt.query(args)?;
    while let Some(r) = rows.next()? {
        let key = (bucket(r.get(0)?), r.get(1)?, r.get(2)?, r.get(3)?);
        let g = all.entry(key).or_default();
        let dwell: Option<f64> = r.get(5)?;
        let kind: String = r.get(4)?;
        match kind.as_str() {
            "enter" => g.enters += 1,
            "leave" => {
                g.leaves += 1;
                g.dwell.extend(dwell);
            }
            "loiter" => g.loiter += 1,
            _ => g.speeding += 1,
        }
    }
    let mut stmt = conn.prepare_cached(
        "SELECT minute, source, step, place, object_s, seconds, max FROM occupancy
         WHERE minute >= ?1 AND minute < ?2
           AND (?3 IS NULL OR source = ?3) AND (?4 IS NULL OR step = ?4)
           AND (?5 IS NULL OR place = ?5)",
    )?;
    let minute = |ms: i64| ms.div_euclid(60_000);
    let first = f
        .after
        .map_or(i64::MIN, |a| minute(a.saturating_add(59_999)));
    let last = f.before.map_or(i64::MAX, minute);
    let mut rows = stmt.query(rusqlite::params![first, last, f.source, f.step, f.place])?;
    while let Some(r) = rows.next()? {
        let key = (
            bucket(r.get::<_, i64>(0)? * 60_000),
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
        );
        let g = all.entry(key).or_default();
        g.object_s += r.get::<_, f64>(4)?;
        g.seconds += r.get::<_, f64>(5)?;
        g.max = Some(g.max.unwrap_or(0).max(r.get(6)?));
    }
    Ok(all.into_iter().map(row).collect())
}

fn row(((t, source, step, place), mut g): (Key, Gathered)) -> ZoneRow {
    g.dwell.sort_by(f64::total_cmp);
    let dwell = (!g.dwell.is_empty()).then(|| Dwell {
        mean: g.dwell.iter().sum::<f64>() / g.dwell.len() as f64,
        p50: percentile(&g.dwell, 0.5),
        p90: percentile(&g.dwell, 0.9),
        max: g.dwell[g.dwell.len() - 1],
    });
    ZoneRow {
        source,
        step,
        place,
        t,
        enters: g.enters,
        leaves: g.leaves,
        visits: g.dwell.len() as i64,
        dwell_s: dwell,
        loiter: g.loiter,
        speeding: g.speeding,
        occupancy: g.max.map(|max| Occupancy {
            mean: if g.seconds > 0.0 {
                g.object_s / g.seconds
            } else {
                0.0
            },
            max,
        }),
    }
}

/// The `q` quantile of `sorted` (nearest rank: a value some visit had).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `GET /api/heatmap`'s filters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeatFilter {
    pub source: Option<String>,
    pub label: Option<String>,
    pub after: Option<i64>,
    pub before: Option<i64>,
    /// `format=png`: a picture rather than JSON.
    pub png: bool,
}

impl HeatFilter {
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, BadParam> {
        let mut f = Self::default();
        for (k, v) in pairs {
            let text = || (!v.is_empty()).then(|| v.clone());
            match k.as_str() {
                "source" => f.source = text(),
                "label" => f.label = text(),
                "after" => f.after = query::time(k, v)?,
                "before" => f.before = query::time(k, v)?,
                "format" => {
                    f.png = match v.as_str() {
                        "" | "json" => false,
                        "png" => true,
                        other => {
                            return Err(BadParam(format!(
                                "format \"{other}\" is not one of json, png"
                            )));
                        }
                    }
                }
                other => {
                    return Err(BadParam(format!(
                        "unknown parameter \"{other}\": expected source, label, after, before, format"
                    )));
                }
            }
        }
        Ok(f)
    }
}

/// A heatmap: seconds objects stood in each cell, row-major.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Heatmap {
    pub cols: usize,
    pub rows: usize,
    /// The picture the grid lies over (its latest row's; 0 with none).
    pub width: i32,
    pub height: i32,
    pub total_s: f64,
    pub seconds: Vec<f32>,
}

/// The heatmap of the minutes `f` asks for (a minute counts when it starts within them).
pub fn heatmap(path: &Path, f: &HeatFilter) -> Result<Heatmap, QueryError> {
    let mut out = Heatmap {
        cols: COLS,
        rows: ROWS,
        width: 0,
        height: 0,
        total_s: 0.0,
        seconds: vec![0.0; COLS * ROWS],
    };
    let Some(conn) = query::open(path)? else {
        return Ok(out);
    };
    let minute = |ms: i64| ms.div_euclid(60_000);
    let first = f
        .after
        .map_or(i64::MIN, |a| minute(a.saturating_add(59_999)));
    let last = f.before.map_or(i64::MAX, minute);
    let mut stmt = conn.prepare_cached(
        "SELECT width, height, cells FROM heatmap
         WHERE minute >= ?1 AND minute < ?2 AND (?3 IS NULL OR source = ?3)
           AND (?4 IS NULL OR label = ?4)
         ORDER BY minute",
    )?;
    let mut rows = stmt.query(rusqlite::params![first, last, f.source, f.label])?;
    let mut cells = Cells::new();
    while let Some(r) = rows.next()? {
        (out.width, out.height) = (r.get(0)?, r.get(1)?);
        let blob: Vec<u8> = r.get(2)?;
        heat::add_blob(&mut cells, &blob);
    }
    for (i, s) in cells {
        if let Some(cell) = out.seconds.get_mut(usize::from(i)) {
            *cell += s;
            out.total_s += f64::from(s);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_values_some_visit_had() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&[4.0], 0.9), 4.0);
    }

    #[test]
    fn bad_parameters_are_named_in_the_message() {
        let pairs = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        let e = ZoneFilter::from_pairs(&pairs("bucket", "week")).unwrap_err();
        assert!(e.0.contains("bucket \"week\""), "{e}");
        let e = HeatFilter::from_pairs(&pairs("format", "gif")).unwrap_err();
        assert_eq!(e.0, "format \"gif\" is not one of json, png");
        assert!(HeatFilter::from_pairs(&pairs("format", "png")).unwrap().png);
    }
}
