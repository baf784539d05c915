//! The JSON API (`/api/...`), answered off the event loop: the loop hands a request whose
//! credentials passed to a queue of [`QUEUE`] requests (past that, 503 at once), served by
//! [`THREADS`] threads, `vidflow-http-api`. A query over the event store may read many rows,
//! and a clip takes a while to send: neither holds the loop, so `/healthz` and `/metrics` are
//! answered meanwhile. Each thread opens the store read-only per request (`events::query`) and
//! lists the storage's files under its lock (a pass holds it for a bounded budget); it writes
//! in blocking mode within [`WRITE_TIMEOUT`] per write, a file within `files::SEND_DEADLINE`.
//!
//! Routes: the table in `routes.rs`, each answered by its handler (`handlers.rs` for events,
//! counts, sources and kept files; `recordings.rs`, `heatmap.rs`), with the answer types of
//! `answer.rs`: JSON, newest first (counts oldest first); 400 with a message for a bad or
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
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};

use super::Shared;
use super::answer::{Answer, Call, pairs, text};
use super::head::Head;
use super::routes::{self, Handler};
use super::workers::Workers;
use crate::events::query::BadParam;

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

/// The answer of the route `routes::find` gives (404 for none, 400 for a query parameter it
/// does not take; `_`, a cache-buster, is taken by every route and ignored).
fn route(head: &Head, shared: &Shared) -> Answer {
    let path = super::path_of(head);
    let found = routes::find(&head.method, path);
    let Some((route, args)) = found.filter(|(r, _)| matches!(r.handler, Handler::Api(_))) else {
        return text(
            404,
            &format!(
                "no such page \"{path}\": try /api/sources, /api/events, /api/counts, /api/counts/zones, /api/heatmap, /api/recordings, /api/live, /api/video/SOURCE"
            ),
        );
    };
    let mut pairs = match pairs(&head.target) {
        Ok(p) => p,
        Err(BadParam(m)) => return text(400, &m),
    };
    if let Some(m) = route.unknown(&pairs) {
        return text(400, &m);
    }
    // Taken and ignored by every route; the handlers refuse what they do not read.
    pairs.retain(|(k, _)| k != routes::IGNORED);
    let parts = shared.live.parts();
    match route.handler {
        Handler::Api(answer) => answer(&Call {
            shared,
            parts: &parts,
            args,
            pairs,
        }),
        Handler::Live | Handler::Video => text(404, "the live stream is not answered here"),
    }
}
