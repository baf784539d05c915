//! `/api/live` and `/api/live/SOURCE`: each frame's boxes and counts as Server-Sent Events
//! (`event: frame`, JSON data, see `daemon::feed::LiveFrame::to_json`), for the page to draw
//! over the preview's JPEG.
//!
//! One thread, `vidflow-http-live`, holds every live client's socket, non-blocking: it takes a
//! frame from the feed (`daemon::feed`), makes its message once, appends it to the buffer of
//! each client of that source and writes what each socket takes without waiting. A client
//! whose unsent bytes pass [`CLIENT_BUFFER`] (it stopped reading, or reads slower than frames
//! come) is closed and counted (`Feed::slow_clients`): it is never waited for, and it costs
//! the others nothing. At most [`max_clients`] clients (past that, 503): [`MAX_LIVE`], or
//! fewer when the file-descriptor limit (raised to its hard limit at start, `daemon::fds`)
//! leaves less room after [`RESERVED_FDS`], so that live clients never take the descriptors
//! the sources, sinks, the event store and `/healthz` need. A comment line every
//! [`KEEPALIVE`] without frames finds the clients that went. The feed only carries frames while
//! a client is connected (`Feed::set_listeners`).
//!
//! Nothing of the frame path waits on this thread (the feed is a `try_send`), but its writes
//! share the cores with it: a write per client per frame, and on loopback the reader's side of
//! TCP runs in the writer's system call too. So the thread runs [`NICENESS`] steps below the
//! daemon's priority: when the cores are busy the frame path goes first, the frames that came
//! meanwhile wait in the feed and go out together, in one write per client (and past
//! [`FEED_QUEUE`] the feed drops and counts them, as it does for any thread behind). Lowering
//! it is `setpriority(2)`, which the shipped unit allows (its `@resources` filter otherwise
//! refuses it); where a system call filter refuses it anyway, the thread says so once (a
//! warning) and runs at the daemon's priority, and `/api/health` shows `live.below_frames:
//! false` (`Feed::priority`).
//!
//! Stop protocol (`workers.rs`): dropping its [`Workers`] drops the stop channel's sender,
//! which wakes the thread; it closes every client and is joined.

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};

use super::Shared;
use super::workers::Workers;
use crate::daemon::feed::{FEED_QUEUE, LiveFrame};

/// Live clients at once, at most: a thousand pages, each a socket and a buffer (up to
/// [`CLIENT_BUFFER`]: 256 MiB for all of them at worst).
pub(super) const MAX_LIVE: usize = 1024;
/// File descriptors the run keeps for the pipeline: its sources' sockets and pipes, its
/// sinks' files and folder indexes, the event store (38 for two test sources and three
/// sinks, measured; an RTSP camera with a record stream adds about a dozen), with room for a
/// few dozen cameras.
const PIPELINE_FDS: usize = 512;
/// File descriptors kept from live clients: the pipeline's, and what the endpoint's other
/// caps may hold (connections being read or answered, previews, the API's and the
/// credentials check's queues and threads, live clients still waiting in [`ARRIVALS`]), and
/// the listener and the odd descriptor the process opens meanwhile.
pub(super) const RESERVED_FDS: usize = PIPELINE_FDS
    + super::poll::MAX_CLIENTS
    + super::MAX_PREVIEWS
    + super::api::QUEUE
    + super::api::THREADS
    + super::verify::QUEUE
    + ARRIVALS
    + 16;
/// Unsent bytes a client may have before it is dropped: some seconds of frames with a few
/// dozen boxes.
pub(super) const CLIENT_BUFFER: usize = 256 * 1024;
/// A comment line after this long without frames: finds clients that went.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Clients waiting to be taken in by the thread.
const ARRIVALS: usize = 256;
/// How far below the daemon's the thread's priority is (nice steps): weighed against a thread
/// of the frame path, it gets about a tenth of a core both want (the kernel's weights for
/// nice 0 and 10: 1024 and 110).
const NICENESS: i32 = 10;

/// A new client and the source it follows (`None`: all).
#[derive(Debug)]
pub(super) struct Arrival {
    pub stream: TcpStream,
    pub source: Option<String>,
}

pub(super) fn queue() -> (Sender<Arrival>, Receiver<Arrival>) {
    bounded(ARRIVALS)
}

/// Live clients at once with `nofile` file descriptors: [`MAX_LIVE`], or what is left of
/// them past [`RESERVED_FDS`].
pub(super) fn max_clients(nofile: u64) -> usize {
    usize::try_from(nofile)
        .unwrap_or(usize::MAX)
        .saturating_sub(RESERVED_FDS)
        .min(MAX_LIVE)
}

/// Starts the live thread on `arrivals`; dropping the result stops and joins it.
pub(super) fn start(arrivals: Receiver<Arrival>, shared: Arc<Shared>) -> std::io::Result<Workers> {
    let nofile = crate::daemon::fds::limit();
    let cap = max_clients(nofile);
    if cap < MAX_LIVE {
        tracing::info!(
            cap,
            nofile,
            "http: live clients capped by the file-descriptor limit"
        );
    }
    shared.live.feed.max_clients.store(cap, Ordering::Relaxed);
    Workers::start("vidflow-http-live", 1, move |stopped| {
        run(&arrivals, stopped, &shared, cap);
    })
}

/// Hands a client to the live thread, or answers 503.
pub(super) fn add(shared: &Shared, mut stream: TcpStream, source: Option<String>) {
    let Some(arrivals) = &shared.arrivals else {
        return;
    };
    if let Err(TrySendError::Full(a) | TrySendError::Disconnected(a)) =
        arrivals.try_send(Arrival { stream, source })
    {
        stream = a.stream;
        let _ = stream.write(&super::refusal(
            503,
            "too many live clients arriving; try again\n",
        ));
    }
}

struct Client {
    stream: TcpStream,
    source: Option<String>,
    pending: Vec<u8>,
    sent: usize,
}

impl Client {
    /// Queues `bytes`; `false` when the client is too far behind (it is to be dropped).
    fn queue(&mut self, bytes: &[u8]) -> bool {
        if self.pending.len() - self.sent + bytes.len() > CLIENT_BUFFER {
            return false;
        }
        if self.sent > 0 && self.sent == self.pending.len() {
            self.pending.clear();
            self.sent = 0;
        }
        self.pending.extend_from_slice(bytes);
        true
    }

    /// Writes what the socket takes now; `false` when the client went.
    fn flush(&mut self) -> bool {
        while self.sent < self.pending.len() {
            match self.stream.write(&self.pending[self.sent..]) {
                Ok(0) => return false,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if self.sent == self.pending.len() {
            self.pending.clear();
            self.sent = 0;
        } else if self.sent > CLIENT_BUFFER / 2 {
            self.pending.drain(..self.sent);
            self.sent = 0;
        }
        true
    }
}

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n";

/// Lowers the calling thread's priority by [`NICENESS`]; on Linux only, where the nice value is
/// a thread's own (setpriority(2), "Bugs"): elsewhere it would lower the whole daemon's.
/// Raising a nice value needs no privilege, but a system call filter may refuse the call
/// (systemd's `SystemCallFilter=~@resources` does, with EPERM).
fn yield_to_the_frames() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority(2) and setpriority(2) take integers and touch no memory of ours;
        // on Linux, who = 0 with PRIO_PROCESS is the calling thread. getpriority may return
        // -1 as a value, so errno is cleared first and read only then.
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, 0);
            if now == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let lower = (now + NICENESS).min(19);
            if libc::setpriority(libc::PRIO_PROCESS, 0, lower) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Lowers the thread's priority and says how it went: in the feed, and once in the log if it
/// was refused.
fn lower_priority(feed: &crate::daemon::feed::Feed) {
    use crate::daemon::feed::{PRIORITY_BELOW_FRAMES, PRIORITY_REFUSED};
    let outcome = match yield_to_the_frames() {
        Ok(()) => PRIORITY_BELOW_FRAMES,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "http: the live thread cannot lower its priority (a system call filter \
                 refusing setpriority?); its writes share the cores with the frames as equals"
            );
            PRIORITY_REFUSED
        }
    };
    feed.priority.store(outcome, Ordering::Relaxed);
}

fn run(arrivals: &Receiver<Arrival>, stopped: &Receiver<()>, shared: &Shared, cap: usize) {
    let feed = &shared.live.feed;
    lower_priority(feed);
    let frames = feed.receiver();
    let mut clients: Vec<Client> = Vec::new();
    loop {
        select! {
            recv(arrivals) -> a => match a {
                Ok(a) => welcome(a, &mut clients, cap, shared),
                Err(_) => break,
            },
            recv(frames) -> f => match f {
                Ok(frame) => {
                    broadcast(&frame, &mut clients, shared);
                    // Frames that came meanwhile go out in the same writes.
                    for frame in frames.try_iter().take(FEED_QUEUE) {
                        broadcast(&frame, &mut clients, shared);
                    }
                }
                Err(_) => break,
            },
            recv(stopped) -> _ => break,
            default(KEEPALIVE) => clients.iter_mut().for_each(|c| {
                let _ = c.queue(b": keepalive\n\n");
            }),
        }
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        clients.retain_mut(Client::flush);
        feed.set_listeners(clients.len());
    }
    feed.set_listeners(0);
}

fn welcome(a: Arrival, clients: &mut Vec<Client>, cap: usize, shared: &Shared) {
    let Arrival { mut stream, source } = a;
    if clients.len() >= cap {
        shared.live.feed.refused.fetch_add(1, Ordering::Relaxed);
        let _ = stream.write(&super::refusal(
            503,
            "too many live clients; try again later\n",
        ));
        return;
    }
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    clients.push(Client {
        stream,
        source,
        pending: HEAD.to_vec(),
        sent: 0,
    });
}

fn broadcast(frame: &LiveFrame, clients: &mut Vec<Client>, shared: &Shared) {
    let message = format!("event: frame\ndata: {}\n\n", frame.to_json());
    let before = clients.len();
    clients.retain_mut(|c| {
        c.source.as_deref().is_some_and(|s| s != &*frame.source) || c.queue(message.as_bytes())
    });
    let slow = before - clients.len();
    if slow > 0 {
        shared
            .live
            .feed
            .slow_clients
            .fetch_add(slow as u64, Ordering::Relaxed);
        tracing::debug!(clients = slow, "live: clients too far behind, closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn the_cap_leaves_the_reserve_to_the_rest_of_the_run() {
        assert_eq!(max_clients(1024), 1024 - RESERVED_FDS);
        assert_eq!(max_clients(65_536), MAX_LIVE);
        assert_eq!(max_clients(100), 0);
        // The usual soft limit still leaves some.
        assert!(max_clients(1024) > 0);
    }

    #[test]
    fn a_client_that_does_not_read_is_let_go_without_a_wait() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().unwrap();
        stream.set_nonblocking(true).unwrap();
        let mut client = Client {
            stream,
            source: None,
            pending: Vec::new(),
            sent: 0,
        };
        let message = vec![b'x'; 16 * 1024];
        // The peer reads nothing: the socket's buffers fill, then the client's own. A write
        // that waited for the peer would hang here.
        let mut queued = 0;
        while client.queue(&message) {
            assert!(client.flush(), "the peer is still there");
            queued += 1;
            assert!(queued < 100_000, "never let go");
        }
        assert!(client.pending.len() - client.sent + message.len() > CLIENT_BUFFER);
    }
}
