//! The endpoint's one event-loop thread, `vidflow-http`: accepts connections, reads request
//! heads and writes short answers, all on non-blocking sockets watched with `poll(2)`. An
//! idle or slow client costs a table entry and a file descriptor here, never a thread; the
//! loop blocks in `poll` until a socket is ready or the nearest deadline passes.
//!
//! Per connection: its head must be complete within [`HEAD_DEADLINE`] of the accept (not per
//! read) and within [`MAX_HEAD`] bytes; its answer must be taken within [`ANSWER_DEADLINE`].
//! At most [`MAX_CLIENTS`] connections are held; a new one past that closes the oldest that
//! is still reading its head (the one nearest its deadline anyway), so a fresh request always
//! gets in; when `accept` fails for want of file descriptors, that same eviction frees one,
//! and with nothing to evict the loop pauses [`ACCEPT_BACKOFF`]. A preview is handed to a
//! thread of its own (`preview.rs`) and leaves the table; so is a request whose credentials
//! need the slow check (`verify.rs`), or it is answered 503 at once when that queue is full.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::head::{self, MAX_HEAD};
use super::verify::{self, Job};
use super::{Reply, Shared};

/// Connections held at once (reading a head or being answered): far more than a few browsers
/// and scrapers need, far below the process's 1024 file descriptors.
pub(super) const MAX_CLIENTS: usize = 64;
/// How long a client may take to send its whole request head: a slowloris client (a byte now
/// and then) is cut off here, however often it sends.
pub(super) const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to read a short answer (a metrics page is some kB).
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);
/// The pause after `accept` fails for want of file descriptors (EMFILE, ENFILE): the
/// listener stays readable, so without it the loop would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);
/// The least time between two warnings that `accept` fails.
const ACCEPT_WARN_INTERVAL: Duration = Duration::from_secs(60);
/// Bytes asked of a socket per read.
const READ_CHUNK: usize = 4096;

/// One connection in the table.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    state: State,
    /// When the current state ends the connection.
    deadline: Instant,
}

#[derive(Debug)]
enum State {
    /// Reading the request head; the bytes so far.
    Head(Vec<u8>),
    /// Writing an answer; the bytes and how many are sent.
    Answer(Vec<u8>, usize),
}

/// Serves until `shared.stop` is raised (the `Server`'s drop then connects to wake `poll`).
pub(super) fn run(listener: &TcpListener, shared: &Arc<Shared>) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "http: cannot make the listener non-blocking; endpoint off");
        return;
    }
    let mut conns: Vec<Conn> = Vec::new();
    let mut accept_warned = None;
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = Vec::with_capacity(conns.len() + 1);
        fds.push(pollfd(listener, libc::POLLIN));
        fds.extend(conns.iter().map(|c| {
            let events = match c.state {
                State::Head(_) => libc::POLLIN,
                State::Answer(..) => libc::POLLOUT,
            };
            pollfd(&c.stream, events)
        }));
        let timeout = conns.iter().map(|c| c.deadline).min().map_or(-1, |d| {
            // Rounded up, so the loop does not wake just before a deadline and spin to it.
            let ms = d.saturating_duration_since(Instant::now()).as_millis() + 1;
            i32::try_from(ms).unwrap_or(i32::MAX)
        });
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` is a live, initialised array of `nfds` pollfd structs that `poll` may
        // write `revents` into; nothing else touches it during the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                tracing::error!(error = %e, "http: poll failed; endpoint off");
                return;
            }
            continue;
        }
        let now = Instant::now();
        conns = conns
            .into_iter()
            .zip(&fds[1..])
            .filter_map(|(conn, fd)| advance(conn, fd.revents, now, shared))
            .collect();
        if fds[0].revents != 0 {
            accept(listener, &mut conns, &mut accept_warned);
        }
    }
}

fn pollfd(socket: &impl AsRawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    }
}

/// Takes every pending connection; when the table is full, the oldest head being read goes.
fn accept(listener: &TcpListener, conns: &mut Vec<Conn>, warned: &mut Option<Instant>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CLIENTS && !evict_oldest_head(conns) {
                    // Every slot is writing an answer: this one is closed unanswered.
                    continue;
                }
                conns.push(Conn {
                    stream,
                    state: State::Head(Vec::new()),
                    deadline: Instant::now() + HEAD_DEADLINE,
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // EMFILE, ENFILE and the like. Warned about once a while, not per try.
                if warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARN_INTERVAL) {
                    tracing::warn!(error = %e, "http: cannot accept connections; closing the oldest unfinished request, or pausing between tries");
                    *warned = Some(Instant::now());
                }
                // A descriptor freed lets the waiting connection in at the next try; with
                // none to free, a pause, since the listener stays readable and would spin.
                if !evict_oldest_head(conns) {
                    std::thread::sleep(ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }
}

/// Closes the connection still reading its head that is nearest its deadline; `false` if none.
fn evict_oldest_head(conns: &mut Vec<Conn>) -> bool {
    let oldest = conns
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c.state, State::Head(_)))
        .min_by_key(|(_, c)| c.deadline)
        .map(|(i, _)| i);
    oldest.is_some_and(|i| {
        drop(conns.swap_remove(i));
        true
    })
}

/// One connection's step after `poll`; `None` once it is closed (or handed to a preview).
fn advance(
    mut conn: Conn,
    revents: libc::c_short,
    now: Instant,
    shared: &Arc<Shared>,
) -> Option<Conn> {
    if revents != 0 {
        match &mut conn.state {
            State::Head(bytes) => match read_some(&mut conn.stream, bytes) {
                Ok(true) => {}
                Ok(false) | Err(_) => return None,
            },
            State::Answer(bytes, sent) => match conn.stream.write(&bytes[*sent..]) {
                Ok(n) => *sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return None,
            },
        }
    }
    if let State::Head(bytes) = &conn.state {
        let reply = if let Some(head) = head::parse(bytes).transpose() {
            Some(super::answer(head, shared))
        } else if bytes.len() > MAX_HEAD {
            Some(Reply::Now(super::refusal(431, "request head too large\n")))
        } else if now >= conn.deadline {
            Some(Reply::Now(super::refusal(
                408,
                "request head took too long\n",
            )))
        } else {
            None
        };
        let now_reply = match reply {
            None => None,
            Some(Reply::Now(bytes)) => Some(bytes),
            Some(
                handed @ (Reply::Preview(_) | Reply::Api(_) | Reply::Live(..) | Reply::Video(..)),
            ) => {
                super::hand_off(handed, conn.stream, shared);
                return None;
            }
            Some(Reply::Verify(pending)) => {
                let (head, credentials) = *pending;
                let job = Job {
                    stream: conn.stream,
                    head,
                    credentials,
                };
                match verify::submit(shared, job) {
                    Ok(()) => return None,
                    Err(job) => {
                        conn.stream = job.stream;
                        Some(super::refusal(
                            503,
                            "too many credential checks at once; try again\n",
                        ))
                    }
                }
            }
        };
        if let Some(bytes) = now_reply {
            conn.state = State::Answer(bytes, 0);
            conn.deadline = now + ANSWER_DEADLINE;
            // Most answers fit the socket's buffer: written now, no second trip.
            if let State::Answer(bytes, sent) = &mut conn.state
                && let Ok(n) = conn.stream.write(bytes)
            {
                *sent = n;
            }
        }
    }
    match &conn.state {
        State::Answer(bytes, sent) if *sent >= bytes.len() => {
            let _ = conn.stream.shutdown(Shutdown::Write);
            None
        }
        _ if now >= conn.deadline => None,
        _ => Some(conn),
    }
}

/// Reads what is there into `bytes`, never past [`MAX_HEAD`] + 1; `Ok(false)`: the peer closed.
fn read_some(stream: &mut TcpStream, bytes: &mut Vec<u8>) -> std::io::Result<bool> {
    let room = (MAX_HEAD + 1).saturating_sub(bytes.len()).min(READ_CHUNK);
    let mut chunk = [0u8; READ_CHUNK];
    match stream.read(&mut chunk[..room]) {
        Ok(0) if room > 0 => Ok(false),
        Ok(n) => {
            bytes.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(true),
        Err(e) => Err(e),
    }
}
