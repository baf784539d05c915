//! The HTTP endpoint (`[http] listen = "127.0.0.1:9464"`): `/metrics` (Prometheus text),
//! `/healthz`, `/preview/SOURCE` (MJPEG), `/stats.json` and `/` (a page with every source's
//! preview and counters).
//!
//! A small HTTP/1.1 server on `std::net`, GET only, one request per connection
//! (`Connection: close`): a streamed MJPEG body must reach the client as each JPEG is written,
//! which a general server crate's buffered, chunked writer does not promise.
//!
//! Threads: `vidflow-http` accepts connections; each connection is served on a thread of its
//! own, `vidflow-http-conn`, at most [`MAX_CONNECTIONS`] at once (more are answered 503 by the
//! acceptor). A request reads only [`Live`]: its atomics, and `Live::parts()` once per request
//! (never cached, so a reload's new steps and sinks show at the next request); the preview
//! reads the preview hub (`sinks::preview`). Nothing here takes a lock the frame path takes.
//!
//! Stop protocol: the port is bound by [`bind`] before the run starts anything (a port in use
//! fails the run at once); [`Bound::serve`] starts the acceptor once `Live`'s parts are set;
//! dropping the [`Server`] (at the end of the run) raises `stop`, wakes the preview watchers
//! (`Hub::wake_all`) and the acceptor (a connection to itself), and joins the acceptor.
//! Connection threads are not joined: each ends at its next wake-up (a JPEG or the stop) or
//! when a read or write times out ([`READ_TIMEOUT`], [`WRITE_TIMEOUT`]).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Live;
use crate::config::HttpConfig;
use crate::sinks::preview::hub;

mod health;
mod metrics;
mod page;
mod preview;

/// Connections served at once: a few browsers, a scraper and spare; more are refused (503).
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its request: a slow or idle client cannot hold a thread.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one write may block: a preview client that stopped reading is let go.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest request head read (GET needs no body).
const MAX_REQUEST: usize = 8 * 1024;

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
}

/// Binds the endpoint's address (a warning if it is not loopback: the endpoint has no
/// authentication).
pub fn bind(config: &HttpConfig) -> Result<Bound, HttpError> {
    let bind_error = |source| HttpError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    if !config.listen.ip().is_loopback() {
        tracing::warn!(listen = %addr, "http endpoint listens beyond this host; it has no authentication");
    }
    Ok(Bound { listener, addr })
}

/// The running endpoint; dropping it stops it (see the module's stop protocol).
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts accepting connections.
    pub fn serve(self, live: Arc<Live>) -> std::io::Result<Server> {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = self.addr;
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("vidflow-http".to_owned())
                .spawn(move || accept(&self.listener, &live, &stop))?
        };
        tracing::info!(listen = %addr, "http endpoint: /metrics, /healthz, /preview/SOURCE, /");
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        hub().wake_all();
        // Wakes the acceptor out of `accept`; it sees `stop` and returns.
        let _ = TcpStream::connect_timeout(&reachable(self.addr), READ_TIMEOUT);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
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

fn accept(listener: &TcpListener, live: &Arc<Live>, stop: &Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut stream) = stream else {
            continue;
        };
        let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            let _ = respond(&mut stream, 503, "text/plain", b"too many connections\n");
            continue;
        }
        let (live, stop, done) = (live.clone(), stop.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("vidflow-http-conn".to_owned())
            .spawn(move || {
                if let Err(e) = serve(stream, &live, &stop) {
                    tracing::debug!(error = %e, "http connection ended");
                }
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            open.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "http: cannot spawn a connection thread");
        }
    }
}

/// Reads one request and answers it.
fn serve(mut stream: TcpStream, live: &Live, stop: &AtomicBool) -> std::io::Result<()> {
    let Some(target) = read_request(&mut stream)? else {
        return respond(&mut stream, 405, "text/plain", b"only GET is served\n");
    };
    let path = target.split('?').next().unwrap_or_default();
    match path {
        "/" => respond(
            &mut stream,
            200,
            "text/html; charset=utf-8",
            page::HTML.as_bytes(),
        ),
        "/metrics" => respond(
            &mut stream,
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(live).as_bytes(),
        ),
        "/stats.json" => respond(&mut stream, 200, "application/json", &metrics::json(live)),
        "/healthz" => match health::check(live) {
            Ok(()) => respond(&mut stream, 200, "text/plain", b"ok\n"),
            Err(reasons) => respond(&mut stream, 503, "text/plain", reasons.as_bytes()),
        },
        _ => match path.strip_prefix("/preview/") {
            Some(source) => preview::stream(stream, live, &percent_decoded(source), stop),
            None => {
                let body = format!(
                    "no such page \"{path}\": try /, /metrics, /healthz, /preview/SOURCE\n"
                );
                respond(&mut stream, 404, "text/plain", body.as_bytes())
            }
        },
    }
}

/// The target of a GET request, or `None` for another method.
fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() + n > MAX_REQUEST {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "incomplete or oversized request",
            ));
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next().unwrap_or_default().split_whitespace();
    match (words.next(), words.next()) {
        (Some("GET"), Some(target)) => Ok(Some(target.to_owned())),
        _ => Ok(None),
    }
}

/// `%20` and the like decoded (a source name is letters, digits, `_` and `-`, but a browser
/// may encode more).
fn percent_decoded(s: &str) -> String {
    crate::spec::percent_decode(s).unwrap_or_else(|| s.to_owned())
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
