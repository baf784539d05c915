//! The JSON API (`/api/...`), answered off the event loop: the loop hands a request whose
//! credentials passed to a queue of [`QUEUE`] requests (past that, 503 at once), served by
//! [`THREADS`] threads, `vidflow-http-api`. A query over the event store may read many rows,
//! and a clip takes a while to send: neither holds the loop, so `/healthz` and `/metrics` are
//! answered meanwhile. Each thread opens the store read-only per request (`events::query`) and
//! lists the storage's files under its lock (a pass holds it for a bounded budget); it writes
//! in blocking mode within [`WRITE_TIMEOUT`] per write, a file within `files::SEND_DEADLINE`.
//!
//! Routes (newest first, JSON arrays; 400 with a message for a bad parameter, 404 for what
//! does not exist, 503 when the store cannot be read):
//! - `GET /api/sources`: each source's state and counters, its last error and its record stream;
//! - `GET /api/health`: the run, its sources and sinks, the storage and the event store;
//! - `GET /api/events?source=&kind=&label=&place=&after=&before=&before_id=&limit=`;
//! - `GET /api/events/{id}`, `/api/events/{id}/snapshot.jpg`, `/api/events/{id}/clip.mp4`;
//! - `GET /api/recordings?source=&after=&before=&limit=&cursor=`: continuous footage, from the
//!   storage's index;
//! - `GET /api/media/{sink}/{id}/{file}`: a file the storage lists, by its sink, the id of its
//!   whole path ([`media_id`]) and its name: two cameras' folders may hold the same names;
//! - `GET /api/counts?source=&step=&bucket=minute|hour|day&after=&before=&limit=&cursor=`.
//!
//! Recordings and counts come a page at a time, `{"recordings"|"counts": [...], "next": CURSOR}`
//! with `Link: <...&cursor=CURSOR>; rel="next"` (RFC 8288) while more remain: each page is read
//! alone (`Storage::page`, `events::query::counts`), never the whole list.
//!
//! Stop protocol (`workers.rs`): dropping the threads' [`Workers`] drops the stop channel's
//! sender, which wakes each thread; a request in progress finishes (bounded as above), those
//! queued are closed unanswered, and the threads are joined.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};
use serde_json::json;

use super::head::Head;
use super::workers::Workers;
use super::{Shared, response};
use crate::events::query::{self, BadParam, CountFilter, EventFilter, EventRow, QueryError};
use crate::storage::{Class, StoredFile};

/// The most recordings one page holds, and how many when `limit` is not given.
pub(super) const MAX_RECORDINGS: u32 = 1000;
const DEFAULT_RECORDINGS: u32 = 100;

/// Requests waiting for an API thread: a few pages' worth of polls.
pub(super) const QUEUE: usize = 64;
/// API threads: one can send a clip while another answers a query.
pub(super) const THREADS: usize = 4;
/// How long one write may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A request for an API thread.
#[derive(Debug)]
pub(super) struct Job {
    pub stream: TcpStream,
    pub head: Head,
}

pub(super) fn queue() -> (Sender<Job>, Receiver<Job>) {
    bounded(QUEUE)
}

/// Starts the [`THREADS`] API threads on `jobs`; dropping the result stops and joins them.
pub(super) fn start(jobs: &Receiver<Job>, shared: &Arc<Shared>) -> std::io::Result<Workers> {
    let (jobs, shared) = (jobs.clone(), shared.clone());
    Workers::start("vidflow-http-api", THREADS, move |stopped| {
        run(&jobs, stopped, &shared);
    })
}

/// Hands a request to the API threads, or answers 503 when they are all busy.
pub(super) fn submit(shared: &Shared, mut stream: TcpStream, head: Head) {
    let Some(jobs) = &shared.api else {
        return;
    };
    if let Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) =
        jobs.try_send(Job { stream, head })
    {
        stream = job.stream;
        let busy = super::refusal(503, "the API is busy; try again\n");
        let _ = stream.write(&busy);
    }
}

fn run(jobs: &Receiver<Job>, stopped: &Receiver<()>, shared: &Arc<Shared>) {
    loop {
        select! {
            recv(jobs) -> job => match job {
                Ok(job) if !shared.stop.load(Ordering::Acquire) => {
                    if let Err(e) = serve(job, shared) {
                        tracing::debug!(error = %e, "http: API answer not sent");
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            },
            recv(stopped) -> _ => return,
        }
    }
}

/// What a route answers.
enum Answer {
    Bytes(Vec<u8>),
    File(std::path::PathBuf),
}

fn serve(job: Job, shared: &Shared) -> std::io::Result<()> {
    let Job { mut stream, head } = job;
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    match route(&head, shared) {
        Answer::Bytes(bytes) => stream.write_all(&bytes)?,
        Answer::File(path) => {
            let kind = super::files::content_type(&path);
            super::files::send(&mut stream, &path, kind, head.range.as_deref())?;
        }
    }
    stream.shutdown(Shutdown::Write)
}

fn json_answer(status: u16, value: &serde_json::Value) -> Answer {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Answer::Bytes(response(status, "application/json", &body, ""))
}

/// A page of `items` of the route `name` (`counts`, `recordings`): `{name: items, "next":
/// cursor}`, and while more remain, a `Link` to the next page: this request's query with the
/// cursor (relative, so that it works under a reverse proxy's sub-path).
fn page_answer(
    name: &str,
    items: serde_json::Value,
    next: Option<String>,
    pairs: &[(String, String)],
) -> Answer {
    let link = next.as_deref().map_or_else(String::new, |cursor| {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let query: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k != "cursor")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain([("cursor", cursor)])
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect();
        format!("Link: <{name}?{}>; rel=\"next\"\r\n", query.join("&"))
    });
    let body = serde_json::to_vec(&json!({ name: items, "next": next })).unwrap_or_default();
    Answer::Bytes(response(200, "application/json", &body, &link))
}

fn text(status: u16, message: &str) -> Answer {
    Answer::Bytes(response(
        status,
        "text/plain; charset=utf-8",
        format!("{message}\n").as_bytes(),
        "",
    ))
}

fn failed(e: &QueryError) -> Answer {
    match e {
        QueryError::Bad(BadParam(m)) => text(400, m),
        QueryError::Store(_) => text(503, &e.to_string()),
    }
}

/// The query's pairs, percent-decoded (`+` is a space, as forms send it).
pub(super) fn pairs(target: &str) -> Result<Vec<(String, String)>, BadParam> {
    let Some((_, query)) = target.split_once('?') else {
        return Ok(Vec::new());
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let decode = |s: &str| {
                crate::spec::percent_decode(&s.replace('+', " "))
                    .ok_or_else(|| BadParam(format!("bad percent-encoding in \"{p}\"")))
            };
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

fn route(head: &Head, shared: &Shared) -> Answer {
    let path = super::path_of(head);
    let pairs = match pairs(&head.target) {
        Ok(p) => p,
        Err(BadParam(m)) => return text(400, &m),
    };
    let parts = shared.live.parts();
    let rest = path.strip_prefix("/api/").unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        ["sources"] => json_answer(200, &super::pages::sources(&shared.live)),
        ["health"] => json_answer(200, &super::pages::health(&shared.live, &parts)),
        ["recordings"] => recordings(&parts, &pairs),
        ["media", sink, id, name] => media(&parts, sink, id, name),
        ["media", ..] => text(
            404,
            "a file's URL is api/media/SINK/ID/NAME, as /api/recordings gives it",
        ),
        ["events"] | ["counts"] | ["events", ..] => {
            let Some(store) = &parts.events else {
                return text(
                    404,
                    "no event store: add [events] path = \"events.db\" to the pipeline",
                );
            };
            let db = store.path.as_path();
            match segments.as_slice() {
                ["events"] => match EventFilter::from_pairs(&pairs)
                    .map_err(QueryError::from)
                    .and_then(|f| query::events(db, &f))
                {
                    Ok(rows) => json_answer(
                        200,
                        &serde_json::Value::Array(rows.iter().map(event_json).collect()),
                    ),
                    Err(e) => failed(&e),
                },
                ["counts"] => match CountFilter::from_pairs(&pairs)
                    .map_err(QueryError::from)
                    .and_then(|f| query::counts(db, &f))
                {
                    Ok(page) => page_answer(
                        "counts",
                        json!(page.rows),
                        page.next.map(|c| query::cursor(&c)),
                        &pairs,
                    ),
                    Err(e) => failed(&e),
                },
                ["events", id, file @ ..] => one_event(&parts, db, id, file),
                _ => text(404, &format!("no such page \"{path}\"")),
            }
        }
        _ => text(
            404,
            &format!(
                "no such page \"{path}\": try /api/sources, /api/events, /api/counts, /api/recordings, /api/live"
            ),
        ),
    }
}

/// An event as the API returns it: its row, with the URLs of its snapshot and clip (relative,
/// so that they work under a reverse proxy's sub-path) when it has them.
fn event_json(e: &EventRow) -> serde_json::Value {
    let mut v = json!(e);
    if let Some(map) = v.as_object_mut() {
        let url = |has: bool, file: &str| {
            has.then(|| format!("api/events/{}/{file}", e.id))
                .map_or(serde_json::Value::Null, serde_json::Value::String)
        };
        map.insert(
            "snapshot_url".into(),
            url(e.snapshot.is_some(), "snapshot.jpg"),
        );
        map.insert("clip_url".into(), url(e.clip.is_some(), "clip.mp4"));
    }
    v
}

fn one_event(parts: &crate::daemon::live::Parts, db: &Path, id: &str, file: &[&str]) -> Answer {
    let Ok(id) = id.parse::<i64>() else {
        return text(400, &format!("event id \"{id}\" is not a whole number"));
    };
    let row = match query::event(db, id) {
        Ok(Some(row)) => row,
        Ok(None) => return text(404, &format!("no event {id}")),
        Err(e) => return failed(&e),
    };
    let wanted = match file {
        [] => return json_answer(200, &event_json(&row)),
        ["snapshot.jpg"] => row.snapshot.as_deref(),
        ["clip.mp4"] => row.clip.as_deref(),
        _ => return text(404, "an event has snapshot.jpg and clip.mp4"),
    };
    match wanted {
        Some(path) => kept(parts, Path::new(path)),
        None => text(404, &format!("event {id} has no such file")),
    }
}

/// The file, if the storage lists it (vidflow wrote it and has not deleted it); else 404.
fn kept(parts: &crate::daemon::live::Parts, path: &Path) -> Answer {
    match &parts.storage {
        Some(storage) if storage.lists(path) => Answer::File(path.to_owned()),
        _ => text(
            404,
            "no such file among those vidflow wrote (deleted by retention, or never written)",
        ),
    }
}

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
            media_id(&f.path),
            enc(&name)
        ),
    })
}

/// Where a page of recordings ended: the run that numbered the files, and the last one's key.
#[derive(serde::Serialize, serde::Deserialize)]
struct RecordingCursor {
    run: u64,
    below: u64,
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
    below: Option<u64>,
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

fn recordings(parts: &crate::daemon::live::Parts, pairs: &[(String, String)]) -> Answer {
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

/// The id of a kept file's path in its URL: the first 64 bits of the SHA-256 of the whole path
/// as written (its folders too), in hex. The same path has the same id in every run, so a
/// link stays good across restarts; files of one name in two folders (two cameras' segments
/// cut at the same second) have two. Only a kept file is ever looked up by it, so it needs no
/// path checks: nothing from the URL is joined to a folder.
fn media_id(path: &Path) -> String {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let digest = sha2::Sha256::digest(path.as_os_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn media(parts: &crate::daemon::live::Parts, sink: &str, id: &str, name: &str) -> Answer {
    let (Some(sink), Some(name)) = (
        crate::spec::percent_decode(sink),
        crate::spec::percent_decode(name),
    ) else {
        return text(400, "bad percent-encoding");
    };
    let found = parts.storage.as_ref().and_then(|s| {
        s.files(None).into_iter().find(|f| {
            *f.sink == *sink
                && f.path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy() == name)
                && media_id(&f.path) == id
        })
    });
    match found {
        Some(f) => Answer::File(f.path),
        None => text(
            404,
            &format!("no file \"{name}\" ({id}) of sink \"{sink}\" among those vidflow wrote"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_are_decoded_and_bad_encoding_is_refused() {
        let p = pairs("/api/events?label=a+b&source=front%20door&limit=").unwrap();
        assert_eq!(
            p,
            vec![
                ("label".into(), "a b".into()),
                ("source".into(), "front door".into()),
                ("limit".into(), String::new()),
            ]
        );
        assert!(pairs("/api/events?label=%zz").is_err());
        assert!(pairs("/api/events").unwrap().is_empty());
    }
}
