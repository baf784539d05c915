//! The JSON API (`/api/...`), answered off the event loop: the loop hands a request whose
//! credentials passed to a queue of [`QUEUE`] requests (past that, 503 at once), served by
//! [`THREADS`] threads, `vidflow-http-api`. A query over the event store may read many rows,
//! and a clip takes a while to send: neither holds the loop, so `/healthz` and `/metrics` are
//! answered meanwhile. Each thread opens the store read-only per request (`events::query`) and
//! lists the storage's files under its lock (a pass holds it for a bounded budget); it writes
//! in blocking mode within [`WRITE_TIMEOUT`] per write, a file within `files::SEND_DEADLINE`.
//!
//! Routes: the table in `routes.rs`, each answered here by its handler (`recordings.rs` for
//! recordings; a kept file at `api/media/{sink}/{id}/{file}`, the id naming its whole path,
//! [`media_id`], since two cameras' folders may hold the same names): JSON, newest first (counts oldest first); 400 with a message for a bad or
//! unknown parameter, 404 for what does not exist (or a path no route takes), 503 when the
//! store cannot be read. docs/reference/api.json documents each, `tests/api_spec.rs` holds
//! the two together.
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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};
use serde_json::json;

use super::head::Head;
use super::routes::{self, Handler};
use super::workers::Workers;
use super::{Shared, response};
use crate::daemon::live::Parts;
use crate::events::query::{self, BadParam, CountFilter, EventFilter, EventRow, QueryError};

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
pub(super) enum Answer {
    Bytes(Vec<u8>),
    File(std::path::PathBuf),
}

/// A request, as a route's handler (`routes::ROUTES`) gets it.
pub(super) struct Call<'a> {
    pub shared: &'a Shared,
    pub parts: &'a Parts,
    /// The path's `{name}` segments, in order, as sent (percent-encoded).
    pub args: Vec<&'a str>,
    /// The query's pairs, percent-decoded; only keys the route takes.
    pub pairs: Vec<(String, String)>,
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

pub(super) fn json_answer(status: u16, value: &serde_json::Value) -> Answer {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Answer::Bytes(response(status, "application/json", &body, ""))
}

/// A page of `items` of the route `name` (`counts`, `recordings`): `{name: items, "next":
/// cursor}`, and while more remain, a `Link` to the next page: this request's query with the
/// cursor (relative, so that it works under a reverse proxy's sub-path).
pub(super) fn page_answer(
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

pub(super) fn text(status: u16, message: &str) -> Answer {
    Answer::Bytes(response(
        status,
        "text/plain; charset=utf-8",
        format!("{message}\n").as_bytes(),
        "",
    ))
}

pub(super) fn failed(e: &QueryError) -> Answer {
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

/// The answer of the route `routes::find` gives (404 for none, 400 for a query parameter it
/// does not take).
fn route(head: &Head, shared: &Shared) -> Answer {
    let path = super::path_of(head);
    let found = routes::find(&head.method, path);
    let Some((route, args)) = found.filter(|(r, _)| matches!(r.handler, Handler::Api(_))) else {
        return text(
            404,
            &format!(
                "no such page \"{path}\": try /api/sources, /api/events, /api/counts, /api/counts/zones, /api/heatmap, /api/recordings, /api/live"
            ),
        );
    };
    let pairs = match pairs(&head.target) {
        Ok(p) => p,
        Err(BadParam(m)) => return text(400, &m),
    };
    if let Some(m) = route.unknown(&pairs) {
        return text(400, &m);
    }
    let parts = shared.live.parts();
    match route.handler {
        Handler::Api(answer) => answer(&Call {
            shared,
            parts: &parts,
            args,
            pairs,
        }),
        Handler::Live => text(404, "the live stream is not answered here"),
    }
}

pub(super) fn sources(c: &Call<'_>) -> Answer {
    json_answer(200, &super::pages::sources(&c.shared.live))
}

pub(super) fn health(c: &Call<'_>) -> Answer {
    json_answer(200, &super::pages::health(&c.shared.live, c.parts))
}

/// The event store's file, or the 404 that says there is none.
pub(super) fn store(c: &Call<'_>) -> Result<PathBuf, Answer> {
    c.parts
        .events
        .as_ref()
        .map(|s| s.path.clone())
        .ok_or_else(|| {
            text(
                404,
                "no event store: add [events] path = \"events.db\" to the pipeline",
            )
        })
}

pub(super) fn events(c: &Call<'_>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    match EventFilter::from_pairs(&c.pairs)
        .map_err(QueryError::from)
        .and_then(|f| query::events(&db, &f))
    {
        Ok(rows) => json_answer(
            200,
            &serde_json::Value::Array(rows.iter().map(event_json).collect()),
        ),
        Err(e) => failed(&e),
    }
}

pub(super) fn counts(c: &Call<'_>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    match CountFilter::from_pairs(&c.pairs)
        .map_err(QueryError::from)
        .and_then(|f| query::counts(&db, &f))
    {
        Ok(page) => page_answer(
            "counts",
            json!(page.rows),
            page.next.map(|c| query::cursor(&c)),
            &c.pairs,
        ),
        Err(e) => failed(&e),
    }
}

/// An event's files.
#[derive(Clone, Copy)]
enum EventFile {
    Snapshot,
    Clip,
}

pub(super) fn event(c: &Call<'_>) -> Answer {
    one_event(c, None)
}

pub(super) fn snapshot(c: &Call<'_>) -> Answer {
    one_event(c, Some(EventFile::Snapshot))
}

pub(super) fn clip(c: &Call<'_>) -> Answer {
    one_event(c, Some(EventFile::Clip))
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

fn one_event(c: &Call<'_>, file: Option<EventFile>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    let id = c.args.first().copied().unwrap_or_default();
    let Ok(id) = id.parse::<i64>() else {
        return text(400, &format!("event id \"{id}\" is not a whole number"));
    };
    let row = match query::event(&db, id) {
        Ok(Some(row)) => row,
        Ok(None) => return text(404, &format!("no event {id}")),
        Err(e) => return failed(&e),
    };
    let wanted = match file {
        None => return json_answer(200, &event_json(&row)),
        Some(EventFile::Snapshot) => row.snapshot.as_deref(),
        Some(EventFile::Clip) => row.clip.as_deref(),
    };
    match wanted {
        Some(path) => kept(c.parts, Path::new(path)),
        None => text(404, &format!("event {id} has no such file")),
    }
}

/// The file, if the storage lists it (vidflow wrote it and has not deleted it); else 404.
fn kept(parts: &Parts, path: &Path) -> Answer {
    match &parts.storage {
        Some(storage) if storage.lists(path) => Answer::File(path.to_owned()),
        _ => text(
            404,
            "no such file among those vidflow wrote (deleted by retention, or never written)",
        ),
    }
}

/// The id of a kept file's path in its URL: the first 64 bits of the SHA-256 of the whole path
/// as written (its folders too), in hex. The same path has the same id in every run, so a
/// link stays good across restarts; files of one name in two folders (two cameras' segments
/// cut at the same second) have two. Only a kept file is ever looked up by it, so it needs no
/// path checks: nothing from the URL is joined to a folder.
pub(super) fn media_id(path: &Path) -> String {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let digest = sha2::Sha256::digest(path.as_os_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn media(c: &Call<'_>) -> Answer {
    let (parts, [sink, id, name]) = (c.parts, c.args.as_slice()) else {
        return text(
            404,
            "a file's URL is api/media/SINK/ID/NAME, as /api/recordings gives it",
        );
    };
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
                && media_id(&f.path) == *id
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
