//! The HTTP endpoint (`[http] listen = "127.0.0.1:9464"`): `/metrics` (Prometheus text),
//! `/healthz`, `/preview/SOURCE` (MJPEG), `/stats.json`, `/` (the page: live boxes, events,
//! counts, recordings, health; `pages.rs`), `/simple` (a one-file status page), the JSON API
//! `/api/...` (`api.rs`; its routes one table, `routes.rs`) and its live stream `/api/live`
//! (`live.rs`).
//!
//! A small HTTP/1.1 server on `std::net` and `poll(2)`, GET only, one request per connection
//! (`Connection: close`). Not a server crate: `tiny_http` limits each read, not the request
//! head, and serves from a pool that idle clients fill; `hyper` brings a tokio runtime to a
//! daemon that has none, and the budgets below (and the Host and credential checks) would
//! still be ours to write. A streamed MJPEG body must also reach the client as each JPEG is
//! written.
//!
//! Budgets, so that nobody can starve `/healthz` and `/metrics`:
//! - Unparsed requests live on one event-loop thread, `vidflow-http` (`poll.rs`): an idle or
//!   slow client costs a file descriptor, not a thread. Its whole head must arrive within
//!   `poll::HEAD_DEADLINE` (one deadline from the accept, not per read) and within
//!   `head::MAX_HEAD` bytes (past that: 431 at once, the rest unread). At most
//!   `poll::MAX_CLIENTS` connections are held; a new one evicts the oldest still sending its
//!   head, so 200 idle connections cannot keep a fresh request out.
//! - Short answers (`/healthz`, `/metrics`, `/stats.json`, `/`, errors) are made and written
//!   by that same loop, without blocking: a client that does not read its answer is dropped
//!   after `ANSWER_DEADLINE` and holds nothing else meanwhile.
//! - Long-lived preview streams have their own cap, [`MAX_PREVIEWS`] threads
//!   (`vidflow-http-preview`); past it a preview is answered 503 and nothing else is
//!   affected. A watcher ends when its client goes, when no JPEG came for a while (a stalled
//!   source), when a reload removed its preview sink, and when the run stops (`preview.rs`).
//!
//! Access (`access.rs`): every request must name a `Host` this endpoint answers to
//! (loopback names, the listen address, `[http] allowed_hosts`), or it gets 421: a web page
//! that rebinds its own name to 127.0.0.1 still sends its own name. With `token_file` or
//! `basic_user` set, every page but `/healthz` asks for credentials (401): a liveness probe
//! has no token, and `/healthz` says only "ok" or why not. An Argon2 password is checked by a
//! thread of its own (`verify.rs`) with a bounded queue, never by the loop. A browser sends no
//! bearer token by itself: a user opens the page once as `/?token=TOKEN`, which answers 303 to
//! `./` with the token in a cookie (`access::TOKEN_COOKIE`) that the page's every request then
//! carries and that counts as the token.
//!
//! Threads: `vidflow-http` (above), `vidflow-http-auth` (the credentials check, with an Argon2
//! password only), one `vidflow-http-preview` per MJPEG client, `api::THREADS`
//! `vidflow-http-api` (the JSON API and media files, off the loop) and one `vidflow-http-live`
//! (every Server-Sent Events client, non-blocking: a slow one is dropped, never waited for). A request
//! reads only [`Live`]: its atomics, and `Live::parts()` once per request (never cached, so a
//! reload's new steps and sinks show at the next request); the preview reads the preview hub
//! (`sinks::preview`). Nothing here takes a lock the frame path takes.
//!
//! Stop protocol: the port is bound by [`bind`] before the run starts anything (a port in use
//! fails the run at once); [`Bound::serve`] starts the loop once `Live`'s parts are set;
//! dropping the [`Server`] (at the end of the run) raises `stop`, wakes the preview watchers
//! (`Hub::wake_all`) and the loop (a connection to itself), and joins the loop, which closes
//! every connection it holds, then stops and joins (`workers.rs`) the credentials thread (after the check it
//! may be in), the API threads (after the answer each may be writing) and the live thread. Preview threads are not joined: each sees `stop` at its next wake-up, at most
//! `preview::WATCH_TICK` later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Live;
use crate::config::HttpConfig;
use crate::sinks::preview::hub;
use access::{Access, Refusal, Verdict};
use head::Head;

mod access;
mod answer;
mod api;
mod files;
mod handlers;
mod head;
mod health;
mod heatmap;
mod live;
mod metrics;
mod page;
mod pages;
mod poll;
mod preview;
mod recordings;
mod routes;
mod stills;
mod verify;
mod video;
mod workers;

pub use routes::{RouteDoc, routes};

/// Preview streams served at once: a few browsers' pages, each showing every source.
pub const MAX_PREVIEWS: usize = 16;

/// Live clients (`/api/live`) served at once by a process allowed `nofile` file descriptors,
/// whose pipeline holds about `pipeline` ([`crate::daemon::fds::Pipeline::descriptors`],
/// `live.rs`).
pub fn max_live_clients(nofile: u64, pipeline: usize) -> usize {
    live::max_clients(nofile, pipeline)
}
/// How long the stop's self-connection may take (it only wakes the loop).
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("http: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl HttpError {
    /// sysexits: 69 (unavailable) while another process holds the port, since that may pass
    /// and systemd may retry; 78 (configuration) for an address a restart cannot fix (not
    /// on this host, a privileged port).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => 69,
            Self::Bind { .. } => 78,
        }
    }
}

/// The endpoint's socket, bound but not yet served.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
    access: Access,
}

/// Binds the endpoint's address (a warning if it is not loopback and asks for no
/// credentials).
pub fn bind(config: &HttpConfig) -> Result<Bound, HttpError> {
    let bind_error = |source| HttpError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    if !config.listen.ip().is_loopback() && !config.authenticates() {
        tracing::warn!(listen = %addr, "http endpoint listens beyond this host without authentication (token_file, basic_user)");
    }
    if let Some(crate::config::BasicAuth {
        password: crate::config::PasswordCheck::Sha256(_),
        ..
    }) = &config.basic
    {
        tracing::warn!(
            "http: basic_password_sha256 is deprecated: an unsalted SHA-256 of a password is \
             cracked at billions of guesses a second if the file leaks; replace it with \
             basic_password_hash (make it with: vidflow hash-password)"
        );
    }
    Ok(Bound {
        listener,
        addr,
        access: Access::new(config, addr),
    })
}

/// The running endpoint; dropping it stops it (see the module's stop protocol).
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The credentials thread, with an Argon2 password; stopped after the loop.
    verifier: Option<workers::Workers>,
    /// The API's threads and the live thread (`api.rs`, `live.rs`); stopped after the loop.
    api: Option<workers::Workers>,
    live: Option<workers::Workers>,
    video: Option<workers::Workers>,
}

/// What the loop and the preview threads share.
#[derive(Debug)]
struct Shared {
    live: Arc<Live>,
    access: Access,
    /// Raised once by the `Server`'s drop (Release); read by the loop and each watcher (Acquire).
    stop: AtomicBool,
    /// Preview threads running: raised by the loop before it starts one, lowered by the
    /// thread as it ends (AcqRel: the count alone matters).
    previews: AtomicUsize,
    /// The credentials thread's queue (`verify.rs`), with an Argon2 password.
    verify: Option<crossbeam_channel::Sender<verify::Job>>,
    /// The API threads' queue and the live thread's arrivals (`api.rs`, `live.rs`).
    api: Option<crossbeam_channel::Sender<api::Job>>,
    arrivals: Option<crossbeam_channel::Sender<live::Arrival>>,
    /// The video thread's arrivals (`video/`), and its viewers now (written by that thread,
    /// read by the live thread: they share one cap; Relaxed, a count).
    video: Option<crossbeam_channel::Sender<video::Arrival>>,
    video_viewers: AtomicUsize,
}

/// What a complete request head gets.
#[derive(Debug)]
enum Reply {
    /// A whole response, written by the loop.
    Now(Vec<u8>),
    /// An MJPEG stream of this source, on a preview thread.
    Preview(String),
    /// For the credentials thread: the head and the credentials to check.
    Verify(Box<(Head, access::Credentials)>),
    /// For an API thread (`api.rs`).
    Api(Box<Head>),
    /// For the live thread: the source followed (`None`: every source), and whether the
    /// cameras' stills go too, and the frames' boxes.
    Live(Option<String>, stills::Asked),
    /// For the video thread: the source watched, and a WebSocket's key.
    Video(String, Option<String>),
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts accepting connections.
    pub fn serve(self, live: Arc<Live>) -> std::io::Result<Server> {
        let addr = self.addr;
        let (jobs, queued) = verify::queue();
        let (api_jobs, api_queued) = api::queue();
        let (arrivals, arrived) = live::queue();
        let (viewers, viewing) = video::queue();
        let slow = self.access.verifies_slowly();
        let shared = Arc::new(Shared {
            live,
            access: self.access,
            stop: AtomicBool::new(false),
            previews: AtomicUsize::new(0),
            verify: slow.then_some(jobs),
            api: Some(api_jobs),
            arrivals: Some(arrivals),
            video: Some(viewers),
            video_viewers: AtomicUsize::new(0),
        });
        let api = api::start(&api_queued, &shared)?;
        let live = live::start(arrived, shared.clone())?;
        let video = video::start(viewing, shared.clone())?;
        let verifier = if slow {
            Some(verify::start(queued, shared.clone())?)
        } else {
            None
        };
        let thread = {
            let shared = shared.clone();
            let listener = self.listener;
            std::thread::Builder::new()
                .name("vidflow-http".to_owned())
                .spawn(move || poll::run(&listener, &shared))?
        };
        tracing::info!(listen = %addr, "http endpoint: the page at http://{}/ (and /api/..., /metrics, /healthz, /preview/SOURCE)", reachable(addr));
        Ok(Server {
            addr,
            shared,
            thread: Some(thread),
            verifier,
            api: Some(api),
            live: Some(live),
            video: Some(video),
        })
    }
}

impl Server {
    /// Stops the endpoint, giving its threads until `until` (the run's stop deadline): the
    /// names of those still busy then, left running (see `workers.rs`).
    pub fn stop_by(mut self, until: Instant) -> Vec<&'static str> {
        self.stop_loop();
        let mut left = Vec::new();
        for workers in self.workers() {
            let name = workers.name();
            if !workers.stop_by(until) {
                left.push(name);
            }
        }
        left
    }

    /// Stops the loop that takes connections and joins it: it returns at once. Once only: a
    /// server stopped by [`Server::stop_by`] is dropped after it.
    fn stop_loop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::Release);
        hub().wake_all();
        // Wakes the loop out of `poll`; it sees `stop` and returns.
        let _ = TcpStream::connect_timeout(&reachable(self.addr), WAKE_TIMEOUT);
        let _ = thread.join();
    }

    /// The endpoint's threads, taken, in the order they stop: the credentials thread first, as
    /// it may be handing a request to the others.
    fn workers(&mut self) -> impl Iterator<Item = workers::Workers> {
        [
            self.verifier.take(),
            self.api.take(),
            self.live.take(),
            self.video.take(),
        ]
        .into_iter()
        .flatten()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_loop();
        for workers in self.workers() {
            workers.stop();
        }
    }
}

/// `addr`, with an unspecified IP (listening on all addresses) replaced by loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// The reply to a complete request head, or why it could not be read.
fn answer(head: Result<Head, head::BadHead>, shared: &Shared) -> Reply {
    let head = match head {
        Ok(head) => head,
        Err(head::BadHead::TooManyHeaders) => {
            return Reply::Now(refusal(431, "too many header lines\n"));
        }
        Err(head::BadHead::Malformed) => return Reply::Now(refusal(400, "bad request\n")),
    };
    match shared.access.check_host(head.host.as_deref()) {
        Ok(()) => {}
        Err(Refusal::NoHost) => return Reply::Now(refusal(400, "no Host header\n")),
        Err(_) => {
            return Reply::Now(refusal(
                421,
                "this endpoint does not answer to that Host (see [http] allowed_hosts)\n",
            ));
        }
    }
    if head.method != "GET" {
        // RFC 9110 (15.5.6): a 405 names the methods the target takes.
        return Reply::Now(response(
            405,
            "text/plain",
            b"only GET is served\n",
            "Allow: GET\r\n",
        ));
    }
    if path_of(&head) == "/healthz" {
        // Open without credentials: a liveness probe has none, and this says only "ok".
        return Reply::Now(match health::check(&shared.live) {
            Ok(()) => response(200, "text/plain", b"ok\n", ""),
            Err(reasons) => response(503, "text/plain", reasons.as_bytes(), ""),
        });
    }
    let verdict = match shared
        .access
        .check_credentials(head.authorization.as_deref())
    {
        Verdict::Refused if page_token(&head).is_some_and(|t| shared.access.check_token(&t)) => {
            Verdict::Granted
        }
        verdict => verdict,
    };
    match verdict {
        Verdict::Granted => authorized(&head, shared),
        Verdict::Refused => Reply::Now(unauthorized(&shared.access)),
        Verdict::Verify(credentials) => Reply::Verify(Box::new((head, credentials))),
    }
}

/// The token a browser offers: the cookie the page set, or `?token=` on the page itself.
fn page_token(head: &Head) -> Option<String> {
    head.cookie_token.clone().or_else(|| query_token(head))
}

/// `?token=` on `/` (the link a user opens once; the page then keeps it in a cookie).
fn query_token(head: &Head) -> Option<String> {
    if path_of(head) != "/" {
        return None;
    }
    answer::pairs(&head.target)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == "token").then_some(v))
}

/// The path of the request's target, without its query.
fn path_of(head: &Head) -> &str {
    head.target.split('?').next().unwrap_or_default()
}

/// The 401 that asks for credentials.
fn unauthorized(access: &Access) -> Vec<u8> {
    response(
        401,
        "text/plain",
        b"credentials needed (see [http] token_file, basic_user); in a browser, open the page once as /?token=TOKEN\n",
        &access.challenge(),
    )
}

/// The reply to a request whose credentials passed (or that needs none).
fn authorized(head: &Head, shared: &Shared) -> Reply {
    let live = &shared.live;
    let path = path_of(head);
    if let Some(reply) = pages_and_api(head, shared) {
        return reply;
    }
    Reply::Now(match path {
        "/simple" => response(200, "text/html; charset=utf-8", page::HTML.as_bytes(), ""),
        "/metrics" => response(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(live).as_bytes(),
            "",
        ),
        "/stats.json" => response(200, "application/json", &metrics::json(live), ""),
        _ => match path.strip_prefix("/preview/") {
            Some(source) => {
                let source = percent_decoded(source);
                return match preview::check(&live.parts(), &source) {
                    Err(why) => Reply::Now(response(404, "text/plain", why.as_bytes(), "")),
                    Ok(()) => Reply::Preview(source),
                };
            }
            None => {
                let body = format!(
                    "no such page \"{path}\": try /, /api/sources, /metrics, /healthz, /preview/SOURCE\n"
                );
                response(404, "text/plain", body.as_bytes(), "")
            }
        },
    })
}

/// The page, its assets, the API and the live stream (`pages.rs`, `api.rs`, `live.rs`).
fn pages_and_api(head: &Head, shared: &Shared) -> Option<Reply> {
    let path = path_of(head);
    if path == "/" {
        if let Some(token) = query_token(head).filter(|t| shared.access.check_token(t)) {
            // Kept in a cookie (HttpOnly: no script reads it; SameSite=Strict: no other site's
            // page sends it; no Path: only the page's own folder, under a proxy's sub-path too;
            // Secure when a proxy says the browser came over TLS: never sent in clear), and
            // taken out of the address bar and its history.
            let value =
                percent_encoding::utf8_percent_encode(&token, percent_encoding::NON_ALPHANUMERIC);
            let secure = if head.https { "; Secure" } else { "" };
            let cookie = format!(
                "Location: ./\r\nSet-Cookie: {}={value}; HttpOnly; SameSite=Strict{secure}\r\n",
                access::TOKEN_COOKIE
            );
            return Some(Reply::Now(response(303, "text/plain", b"", &cookie)));
        }
        return Some(Reply::Now(response(
            200,
            "text/html; charset=utf-8",
            pages::INDEX,
            "",
        )));
    }
    if let Some(name) = path.strip_prefix("/assets/") {
        return Some(Reply::Now(match pages::asset(name) {
            Some((kind, bytes)) => response(200, kind, bytes, ""),
            None => refusal(404, "no such asset\n"),
        }));
    }
    path.starts_with("/api/").then(|| api_reply(head, shared))
}

/// An API request: the live stream's on the loop (it goes to the live thread), the others on
/// the API threads (which also answer a path no route takes).
fn api_reply(head: &Head, shared: &Shared) -> Reply {
    let path = path_of(head);
    let Some((route, args)) = routes::find(&head.method, path) else {
        return Reply::Api(Box::new(head.clone()));
    };
    if matches!(route.handler, routes::Handler::Video) {
        return video_reply(head, route, &args, shared);
    }
    if !matches!(route.handler, routes::Handler::Live) {
        return Reply::Api(Box::new(head.clone()));
    }
    match answer::pairs(&head.target).map(|p| route.unknown(&p)) {
        Ok(None) => {}
        Ok(Some(m)) | Err(crate::events::query::BadParam(m)) => {
            return Reply::Now(refusal(400, &format!("{m}\n")));
        }
    }
    let stills = match stills::asked(&head.target) {
        Ok(stills) => stills,
        Err(why) => return Reply::Now(refusal(400, &why)),
    };
    let Some(source) = args.first() else {
        return Reply::Live(None, stills);
    };
    let source = percent_decoded(source);
    if !known_source(shared, &source) {
        let body = format!("no source \"{source}\"\n");
        return Reply::Now(refusal(404, &body));
    }
    Reply::Live(Some(source), stills)
}

/// Whether the pipeline, as it is now, has a source of that name.
fn known_source(shared: &Shared, name: &str) -> bool {
    shared.live.parts().sources.iter().any(|s| *s.name == *name)
}

/// A live video request (`video/`): 400 for a parameter, 404 for an unknown source, 409 for
/// one whose stream is neither H.264 nor H.265, 403 for a WebSocket opened by another site's
/// page; else it goes to the video thread.
fn video_reply(head: &Head, route: &routes::Route, args: &[&str], shared: &Shared) -> Reply {
    match answer::pairs(&head.target).map(|p| route.unknown(&p)) {
        Ok(None) => {}
        Ok(Some(m)) | Err(crate::events::query::BadParam(m)) => {
            return Reply::Now(video::error(400, &m));
        }
    }
    let source = percent_decoded(args.first().copied().unwrap_or_default());
    if !known_source(shared, &source) {
        return Reply::Now(video::error(404, &format!("no source \"{source}\"")));
    }
    if let Some(why) = video::refusal(&source, &crate::packets::hub().video(&source).status()) {
        return Reply::Now(video::error(409, &why));
    }
    // A WebSocket is not bound by the same-origin policy: a page of another site that the
    // browser sends here with this Host would get the video. Its Origin names that site.
    if head.websocket_key.is_some()
        && let Some(origin) = &head.origin
    {
        let authority = origin.split_once("://").map_or(origin.as_str(), |(_, a)| a);
        if shared.access.check_host(Some(authority)).is_err() {
            return Reply::Now(video::error(
                403,
                &format!("a page of {origin} may not open this video (see [http] allowed_hosts)"),
            ));
        }
    }
    Reply::Video(source, head.websocket_key.clone())
}

/// Hands a connection to the thread that answers `reply` (a preview, the API, the live
/// stream); the loop and the credentials thread answer the others themselves.
fn hand_off(reply: Reply, stream: TcpStream, shared: &Arc<Shared>) {
    match reply {
        Reply::Preview(source) => preview::start(stream, shared, source),
        Reply::Api(head) => api::submit(shared, stream, *head),
        Reply::Live(source, asked) => live::add(
            shared,
            live::Arrival {
                stream,
                source,
                stills: asked.stills,
                stills_of: asked.stills_of,
                frames: asked.frames,
            },
        ),
        Reply::Video(source, ws_key) => video::add(
            shared,
            video::Arrival {
                stream,
                source,
                ws_key,
            },
        ),
        Reply::Now(_) | Reply::Verify(_) => {}
    }
}

/// `%20` and the like decoded (a source name is letters, digits, `_` and `-`, but a browser
/// may encode more).
fn percent_decoded(s: &str) -> String {
    crate::spec::percent_decode(s).unwrap_or_else(|| s.to_owned())
}

/// A plain-text refusal.
fn refusal(status: u16, body: &str) -> Vec<u8> {
    response(status, "text/plain", body.as_bytes(), "")
}

/// A whole response; `extra` is more header lines, each ending in CRLF.
fn response(status: u16, content_type: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        416 => "Range Not Satisfiable",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests;
