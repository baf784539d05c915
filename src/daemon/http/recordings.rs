//! `GET /api/recordings`: continuous footage from the storage's index, newest first by each
//! file's start time (across cameras), a page at a time (`Storage::page` copies only the page). Its cursor names the run whose storage
//! numbered the files: a restarted vidflow numbers them anew, and refuses an older cursor.

use std::time::SystemTime;

use serde_json::json;

use super::answer::{Answer, Call, page_answer, text};
use crate::events::query::{self, BadParam};
use crate::storage::{Class, PageKey, StoredFile};

/// The most recordings one page holds, and how many when `limit` is not given.
pub(super) const MAX_RECORDINGS: u32 = 1000;
const DEFAULT_RECORDINGS: u32 = 100;

fn file_json(f: &StoredFile) -> serde_json::Value {
    let name = f
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    json!({
        "source": &*f.source,
        "sink": &*f.sink,
        "name": name,
        "start": crate::events::millis(f.created),
        "end": f.closed.map(crate::events::millis),
        "bytes": f.bytes,
        "url": format!(
            "api/media/{}/{}/{}",
            enc(&f.sink),
            super::handlers::media_id(&f.path),
            enc(&name)
        ),
    })
}

/// Where a page of recordings ended: the run that numbered the files, and the last one's
/// start time and key.
#[derive(serde::Serialize, serde::Deserialize)]
struct RecordingCursor {
    run: u64,
    below: PageKey,
}

/// This run's number: storage keys are a run's own (`Storage::page`), so a cursor of another
/// run is refused rather than read as another place in the list.
fn run_number() -> u64 {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RUN.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        now ^ u64::from(std::process::id()).rotate_left(40)
    })
}

/// `GET /api/recordings`'s parameters: the source, the range, the page's size and start.
struct RecordingFilter<'a> {
    source: Option<&'a str>,
    after: Option<i64>,
    before: Option<i64>,
    limit: u32,
    below: Option<PageKey>,
}

impl<'a> RecordingFilter<'a> {
    fn from_pairs(pairs: &'a [(String, String)]) -> Result<Self, BadParam> {
        let mut f = Self {
            source: None,
            after: None,
            before: None,
            limit: DEFAULT_RECORDINGS,
            below: None,
        };
        for (k, v) in pairs {
            match k.as_str() {
                "source" => f.source = (!v.is_empty()).then_some(v.as_str()),
                "after" => f.after = query::time(k, v)?,
                "before" => f.before = query::time(k, v)?,
                "limit" => f.limit = query::limit(v, MAX_RECORDINGS)?,
                "cursor" if v.is_empty() => f.below = None,
                "cursor" => {
                    let c: RecordingCursor = query::from_cursor(v)?;
                    if c.run != run_number() {
                        return Err(BadParam(format!(
                            "cursor \"{v}\" is of an earlier run of vidflow (a run numbers its files anew): start again without it"
                        )));
                    }
                    f.below = Some(c.below);
                }
                other => {
                    return Err(BadParam(format!(
                        "unknown parameter \"{other}\": expected source, after, before, limit, cursor"
                    )));
                }
            }
        }
        Ok(f)
    }

    /// Whether a file of `source`, made at `created` and finished at `closed`, is asked for:
    /// its source, and footage overlapping the range.
    fn takes(&self, source: &str, created: SystemTime, closed: Option<SystemTime>) -> bool {
        let start = crate::events::millis(created);
        let end = closed.map_or(i64::MAX, crate::events::millis);
        self.source.is_none_or(|s| source == s)
            && self.before.is_none_or(|b| start < b)
            && self.after.is_none_or(|a| end >= a)
    }
}

pub(super) fn recordings(c: &Call<'_>) -> Answer {
    let (parts, pairs) = (c.parts, c.pairs.as_slice());
    let f = match RecordingFilter::from_pairs(pairs) {
        Ok(f) => f,
        Err(BadParam(m)) => return text(400, &m),
    };
    let Some(storage) = &parts.storage else {
        return page_answer("recordings", json!([]), None, pairs);
    };
    let (files, below) = storage.page(Class::Continuous, f.below, f.limit as usize, |s, c, e| {
        f.takes(s, c, e)
    });
    let next = below.map(|below| {
        query::cursor(&RecordingCursor {
            run: run_number(),
            below,
        })
    });
    let items = files.iter().map(file_json).collect::<Vec<_>>();
    page_answer("recordings", json!(items), next, pairs)
}
