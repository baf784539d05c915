//! `/api/live?stills=1` and `/api/live/SOURCE?stills=1`: each frame's boxes and counts as
//! Server-Sent Events (`event: frame`, JSON data, see `daemon::feed::LiveFrame::to_json`), for
//! the page to draw over the preview's JPEG; with `stills=1`, those JPEGs too (`event: still`,
//! at a bounded rate, `stills.rs`), so that the page needs no other long-lived connection.
//!
//! One thread, `vidflow-http-live`, holds every live client's socket, non-blocking: it takes a
//! frame from the feed (`daemon::feed`), makes its message once, appends it to the buffer of
//! each client of that source and writes what each socket takes without waiting. A client
//! whose unsent bytes pass [`CLIENT_BUFFER`] (it stopped reading, or reads slower than frames
//! come) is closed and counted (`Feed::slow_clients`): it is never waited for, and it costs
//! the others nothing. At most [`max_clients`] clients (past that, 503): [`MAX_LIVE`], or
//! fewer when the file-descriptor limit (raised to its hard limit at start, `daemon::fds`)
//! leaves less room after what the pipeline holds (estimated from its parts as they are now,
//! `daemon::fds::Pipeline`: so a reload that adds cameras lowers the cap) and the endpoint's
//! own ([`HTTP_FDS`]), so that live clients never take the descriptors the sources, sinks, the
//! event store and `/healthz` need; a cap under [`FEW_CLIENTS`] is a warning. A comment line
//! every [`KEEPALIVE`] without frames finds the clients that went. The feed only carries frames
//! while a client is connected (`Feed::set_listeners`), and a client that asked `frames=0` gets
//! none. A client's stills wait apart from its buffer, one per source, and enter it a part at a
//! time, each once the socket took the rest (`stills.rs`).
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

use std::collections::BTreeSet;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};

use super::Shared;
use super::stills::{Slots, Still, Watches};
use super::workers::Workers;
use crate::daemon::feed::{FEED_QUEUE, Feed, LiveFrame};

/// Live clients at once, at most: a thousand pages, each a socket and a buffer (up to
/// [`CLIENT_BUFFER`]: 256 MiB for all of them at worst; the stills they are sent are shared
/// between them, never copied per client but a part at a time, `stills.rs`).
pub(super) const MAX_LIVE: usize = 1024;
/// File descriptors the endpoint itself may hold beside its live clients: the connections
/// being read or answered, previews, the API's and the credentials check's queues and
/// threads, live clients still waiting in [`ARRIVALS`], and the listener and the odd
/// descriptor it opens meanwhile. The pipeline's own are estimated apart, from its parts
/// (`daemon::fds::Pipeline`).
pub(super) const HTTP_FDS: usize = super::poll::MAX_CLIENTS
    + super::MAX_PREVIEWS
    + super::api::QUEUE
    + super::api::THREADS
    + super::verify::QUEUE
    + ARRIVALS
    + 16;
/// Below this many live clients, the start says so (a warning): a few pages open at once, or
/// one reloaded a few times, would be refused (and retry).
const FEW_CLIENTS: usize = 16;
/// Unsent bytes a client may have before it is dropped: some seconds of frames with a few
/// dozen boxes.
pub(super) const CLIENT_BUFFER: usize = 256 * 1024;
/// A comment line after this long without frames: finds clients that went.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Clients waiting to be taken in by the thread: it takes them in as fast as they come, so a
/// few dozen; past that they get a 503, and a page tries again after a while.
const ARRIVALS: usize = 32;
/// How far below the daemon's the thread's priority is (nice steps): weighed against a thread
/// of the frame path, it gets about a tenth of a core both want (the kernel's weights for
/// nice 0 and 10: 1024 and 110).
const NICENESS: i32 = 10;

/// A new client, the source it follows (`None`: all), whether it asked for stills and for
/// the frames' boxes (`frames=0`: the stills only).
#[derive(Debug)]
pub(super) struct Arrival {
    pub stream: TcpStream,
    pub source: Option<String>,
    pub stills: bool,
    /// The sources whose stills it takes (`stills_of`); `None`: all it follows.
    pub stills_of: Option<BTreeSet<String>>,
    pub frames: bool,
}

pub(super) fn queue() -> (Sender<Arrival>, Receiver<Arrival>) {
    bounded(ARRIVALS)
}

/// Live clients at once with `nofile` file descriptors and a pipeline that holds about
/// `pipeline` of them ([`crate::daemon::fds::Pipeline::descriptors`]): [`MAX_LIVE`], or what is
/// left past the pipeline's and the endpoint's own ([`HTTP_FDS`]).
pub(super) fn max_clients(nofile: u64, pipeline: usize) -> usize {
    usize::try_from(nofile)
        .unwrap_or(usize::MAX)
        .saturating_sub(pipeline + HTTP_FDS)
        .min(MAX_LIVE)
}

/// What the run's parts open, as [`crate::daemon::fds::Pipeline`] counts them.
fn pipeline(parts: &crate::daemon::live::Parts) -> crate::daemon::fds::Pipeline {
    crate::daemon::fds::Pipeline {
        sources: parts.sources.len(),
        record_streams: parts.sources.iter().filter(|s| s.record.is_some()).count(),
        sinks: parts.sinks.len(),
        event_store: parts.events.is_some(),
    }
}

/// The live clients' cap, from the descriptor limit and the run's parts as they are now (a
/// reload may change them); said when it changes, with a warning when it is small.
#[derive(Debug, Default, Clone)]
struct Cap {
    /// The parts it was last sized for.
    parts: Option<Arc<crate::daemon::live::Parts>>,
    clients: usize,
}

impl Cap {
    fn now(&mut self, shared: &Shared) -> usize {
        let parts = shared.live.parts();
        if self.parts.as_ref().is_some_and(|p| Arc::ptr_eq(p, &parts)) {
            return self.clients;
        }
        let nofile = crate::daemon::fds::limit();
        let reserve = pipeline(&parts).descriptors();
        let cap = max_clients(nofile, reserve);
        if cap != self.clients || self.parts.is_none() {
            let reserve = reserve + HTTP_FDS;
            if cap < FEW_CLIENTS {
                tracing::warn!(
                    cap,
                    nofile,
                    reserve,
                    "http: only {cap} live clients (pages) at once: the file-descriptor limit \
                     leaves little past what the pipeline and the endpoint keep; raise it \
                     (LimitNOFILE=, ulimit -n)"
                );
            } else if cap < MAX_LIVE {
                tracing::info!(
                    cap,
                    nofile,
                    reserve,
                    "http: live clients capped by the file-descriptor limit"
                );
            }
        }
        shared.live.feed.max_clients.store(cap, Ordering::Relaxed);
        self.parts = Some(parts);
        self.clients = cap;
        cap
    }
}

/// Starts the live thread on `arrivals`; dropping the result stops and joins it.
pub(super) fn start(arrivals: Receiver<Arrival>, shared: Arc<Shared>) -> std::io::Result<Workers> {
    let mut cap = Cap::default();
    cap.now(&shared);
    Workers::start("vidflow-http-live", 1, move |stopped| {
        run(&arrivals, stopped, &shared, cap.clone());
    })
}

/// Hands a client to the live thread, or answers 503.
pub(super) fn add(shared: &Shared, arrival: Arrival) {
    let Some(arrivals) = &shared.arrivals else {
        return;
    };
    if let Err(TrySendError::Full(a) | TrySendError::Disconnected(a)) = arrivals.try_send(arrival) {
        let mut stream = a.stream;
        let _ = stream.write(&super::refusal(
            503,
            "too many live clients arriving; try again\n",
        ));
    }
}

struct Client {
    stream: TcpStream,
    source: Option<String>,
    /// Whether it takes the frames' messages (`frames=0`: only stills).
    frames: bool,
    /// Whole messages to send, from `sent` on: frames' and at most one part of a still, all
    /// within [`CLIENT_BUFFER`].
    pending: Vec<u8>,
    sent: usize,
    /// With `stills=1`: the stills not begun yet, one per source.
    stills: Option<Slots>,
    /// With `stills_of`: the sources whose stills it takes.
    stills_of: Option<BTreeSet<String>>,
    /// The still being sent, and its next part not yet in `pending`: its parts go one at a
    /// time, each once the socket took all before it, so frames wait behind one part at most.
    sending: Option<(Still, usize)>,
}

impl Client {
    fn new(stream: TcpStream, source: Option<String>, stills: bool, frames: bool) -> Self {
        Self {
            stream,
            source,
            frames,
            pending: HEAD.to_vec(),
            sent: 0,
            stills: stills.then(Slots::default),
            stills_of: None,
            sending: None,
        }
    }

    /// Queues `bytes`; `false` when the client is too far behind (it is to be dropped): what
    /// it has not been sent, a still's part included, would pass [`CLIENT_BUFFER`].
    fn queue(&mut self, bytes: &[u8]) -> bool {
        if self.pending.len() - self.sent + bytes.len() > CLIENT_BUFFER {
            return false;
        }
        if self.sent > 0 && self.sent == self.pending.len() {
            self.emptied();
        }
        self.pending.extend_from_slice(bytes);
        true
    }

    /// Writes what the socket takes now, then the stills' parts while it takes them all;
    /// `false` when the client went.
    fn flush(&mut self) -> bool {
        loop {
            while self.sent < self.pending.len() {
                match self.stream.write(&self.pending[self.sent..]) {
                    Ok(0) => return false,
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            if self.sent < self.pending.len() {
                if self.sent > CLIENT_BUFFER / 2 {
                    self.pending.drain(..self.sent);
                    self.sent = 0;
                }
                return true;
            }
            self.emptied();
            let Some(part) = self.next_part() else {
                return true;
            };
            self.pending.extend_from_slice(&part);
        }
    }

    /// The next part of the still being sent, or the first of the next still waiting.
    fn next_part(&mut self) -> Option<Arc<[u8]>> {
        if self.sending.is_none() {
            let still = self.stills.as_mut()?.next()?;
            self.sending = Some((still, 0));
        }
        let (still, next) = self.sending.as_mut()?;
        let part = still.get(*next).cloned();
        *next += 1;
        if *next >= still.len() {
            self.sending = None;
        }
        part
    }

    /// Forgets the bytes sent, all of `pending`.
    fn emptied(&mut self) {
        self.pending.clear();
        self.sent = 0;
    }
}

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n";

/// Lowers the calling thread's priority by [`NICENESS`]; on Linux only, where the nice value is
/// a thread's own (setpriority(2), "Bugs"): elsewhere it would lower the whole daemon's.
/// Raising a nice value needs no privilege, but a system call filter may refuse the call
/// (systemd's `SystemCallFilter=~@resources` does, with EPERM).
pub(super) fn yield_to_the_frames() -> std::io::Result<()> {
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

fn run(arrivals: &Receiver<Arrival>, stopped: &Receiver<()>, shared: &Shared, mut cap: Cap) {
    let feed = &shared.live.feed;
    lower_priority(feed);
    let frames = feed.receiver();
    let mut clients: Vec<Client> = Vec::new();
    let mut watches = Watches::default();
    // When something was last queued for the clients.
    let mut queued = Instant::now();
    loop {
        select! {
            recv(arrivals) -> a => match a {
                Ok(a) => welcome(a, &mut clients, cap.now(shared), shared),
                Err(_) => break,
            },
            recv(frames) -> f => match f {
                Ok(frame) => {
                    broadcast(&frame, &mut clients, shared);
                    // Frames that came meanwhile go out in the same writes.
                    for frame in frames.try_iter().take(FEED_QUEUE) {
                        broadcast(&frame, &mut clients, shared);
                    }
                    queued = Instant::now();
                }
                Err(_) => break,
            },
            recv(stopped) -> _ => break,
            default(watches.wait(KEEPALIVE)) => if queued.elapsed() >= KEEPALIVE {
                clients.iter_mut().for_each(|c| {
                    let _ = c.queue(b": keepalive\n\n");
                });
                queued = Instant::now();
            },
        }
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let followed = clients.iter().filter(|c| c.stills.is_some());
        let followed = followed.map(|c| (c.source.as_deref(), c.stills_of.as_ref()));
        let stills = watches.pass(&shared.live, followed);
        if !stills.is_empty() {
            offer(&stills, &mut clients, feed);
            queued = Instant::now();
        }
        clients.retain_mut(Client::flush);
        feed.set_listeners(clients.len());
    }
    feed.set_listeners(0);
}

fn welcome(a: Arrival, clients: &mut Vec<Client>, cap: usize, shared: &Shared) {
    let Arrival {
        mut stream,
        source,
        stills,
        stills_of,
        frames,
    } = a;
    // Video viewers (`video/`) share the cap.
    if clients.len() + shared.video_viewers.load(Ordering::Relaxed) >= cap {
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
    let mut client = Client::new(stream, source, stills, frames);
    client.stills_of = stills_of;
    clients.push(client);
}

/// Offers each new still to the clients that asked for stills of its source.
fn offer(stills: &[(Arc<str>, Still)], clients: &mut [Client], feed: &Feed) {
    let mut dropped = 0;
    for (source, message) in stills {
        let follow = |c: &&mut Client| {
            c.source.as_deref().is_none_or(|s| s == &**source)
                && c.stills_of.as_ref().is_none_or(|o| o.contains(&**source))
        };
        for c in clients.iter_mut().filter(follow) {
            if let Some(slots) = &mut c.stills {
                dropped += u64::from(slots.offer(source, message));
            }
        }
    }
    feed.stills_dropped.fetch_add(dropped, Ordering::Relaxed);
}

fn broadcast(frame: &LiveFrame, clients: &mut Vec<Client>, shared: &Shared) {
    let message = format!("event: frame\ndata: {}\n\n", frame.to_json());
    let before = clients.len();
    clients.retain_mut(|c| {
        !c.frames
            || c.source.as_deref().is_some_and(|s| s != &*frame.source)
            || c.queue(message.as_bytes())
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
    use crate::daemon::fds::Pipeline;
    use std::io::Read;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_cap_leaves_the_pipelines_descriptors_and_the_endpoints_to_the_rest_of_the_run() {
        let one = Pipeline {
            sources: 1,
            sinks: 1,
            ..Pipeline::default()
        }
        .descriptors();
        assert_eq!(max_clients(1024, one), 1024 - one - HTTP_FDS);
        assert_eq!(max_clients(65_536, one), MAX_LIVE);
        assert_eq!(max_clients(100, one), 0);
        // A hard limit of 512 still leaves a small pipeline's page room.
        assert!(
            max_clients(512, one) >= FEW_CLIENTS,
            "{}",
            max_clients(512, one)
        );
        // Ten cameras recorded with an event store keep more.
        let ten = Pipeline {
            sources: 10,
            record_streams: 10,
            sinks: 3,
            event_store: true,
        }
        .descriptors();
        assert!(max_clients(1024, ten) < max_clients(1024, one));
        assert!(max_clients(1024, ten) >= FEW_CLIENTS);
    }

    /// A client whose peer reads nothing unless the test reads it, both sockets' buffers small.
    fn unread(stills: Option<Slots>) -> (Client, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().unwrap();
        stream.set_nonblocking(true).unwrap();
        // Guards against a hang only.
        peer.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        for (fd, option) in [
            (stream.as_raw_fd(), libc::SO_SNDBUF),
            (peer.as_raw_fd(), libc::SO_RCVBUF),
        ] {
            let size: libc::c_int = 8 * 1024;
            // SAFETY: setsockopt reads the int we pass by pointer, with its size.
            let set = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    option,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(set, 0);
        }
        let mut client = Client::new(stream, None, stills.is_some(), true);
        client.stills = stills;
        (client, peer)
    }

    /// A still of `bytes` bytes of JPEG, as the live thread would offer it.
    fn still(source: &str, bytes: usize) -> Still {
        super::super::stills::tests::message_of(source, &vec![0x5a; bytes])
    }

    #[test]
    fn a_client_that_does_not_read_is_let_go_without_a_wait() {
        let (mut client, _peer) = unread(None);
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

    #[test]
    fn a_client_that_does_not_read_holds_its_stills_within_its_budget_and_one_per_source() {
        let (mut client, _peer) = unread(Some(Slots::default()));
        let sources: Vec<Arc<str>> = (1..=6).map(|n| format!("cam{n}").into()).collect();
        // A 4K camera's JPEG: about 1.3 MB in base64, far past the budget.
        let still = still("cam", 1_000_000);
        let frame = vec![b'f'; 1024];
        let mut dropped = 0;
        let mut rounds = 0;
        // Each round, a still of every camera and a frame, as the live thread would offer them.
        loop {
            for source in &sources {
                let slots = client.stills.as_mut().unwrap();
                dropped += u64::from(slots.offer(source, &still));
            }
            if !client.queue(&frame) {
                break;
            }
            assert!(client.flush(), "the peer is still there");
            let unsent = &client.pending[client.sent..];
            assert!(
                unsent.len() <= CLIENT_BUFFER,
                "{} bytes unsent after {rounds} rounds",
                unsent.len()
            );
            let parts = unsent.windows(12).filter(|w| w == b"event: still").count();
            assert!(parts <= 1, "{parts} parts of stills queued");
            rounds += 1;
            assert!(rounds < 100_000, "never let go");
        }
        assert!(dropped > 0, "no still was dropped in {rounds} rounds");
        let slots = client.stills.as_mut().unwrap();
        let waiting = std::iter::from_fn(|| slots.next()).count();
        assert!(waiting <= sources.len(), "{waiting} stills wait");
    }

    #[test]
    fn frames_go_out_between_the_parts_of_a_big_still() {
        let (mut client, mut peer) = unread(Some(Slots::default()));
        let mut got = Vec::new();
        client
            .stills
            .as_mut()
            .unwrap()
            .offer(&"cam".into(), &still("cam", 300_000));
        // A frame each round while the peer reads a little, as a slow page would.
        let mut buf = [0; 4096];
        for n in 0..100_000 {
            let frame = format!("event: frame\ndata: {n}\n\n");
            assert!(
                client.queue(frame.as_bytes()),
                "closed as slow at frame {n}"
            );
            assert!(client.flush());
            if client.sending.is_none() && client.sent == client.pending.len() {
                break;
            }
            // Something waits in the socket: the frame just written, or what keeps it full.
            let read = peer.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..read]);
        }
        drop(client);
        peer.read_to_end(&mut got).unwrap();
        let text = String::from_utf8(got).unwrap();
        let first = text.find("event: still").unwrap();
        let last = text.rfind("event: still").unwrap();
        let between = text[first..last].matches("event: frame").count();
        assert!(between > 0, "every frame waited for the whole still");
        let parts = text.matches("event: still").count();
        assert_eq!(
            parts,
            400_000_usize.div_ceil(super::super::stills::STILL_PART)
        );
    }
}
