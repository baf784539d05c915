//! One viewer of `/api/video/SOURCE`: its socket (non-blocking), what it has still to be sent,
//! and the rule that keeps it live: a viewer is never waited for, and one that falls behind is
//! skipped forward to the next keyframe.
//!
//! What waits for a viewer: chunks, each a message (a head, an init segment, a fragment) with
//! the bytes that frame it (a WebSocket frame's header), sent whole and in order. A fragment's
//! bytes are shared by every viewer of its source (`Arc`), so a viewer costs its queue of
//! references, and a source's memory is bounded by its slowest viewer's [`VIEWER_BYTES`],
//! whatever the number of viewers.
//!
//! Skips: when a keyframe comes while a viewer still has fragments not begun that reach more
//! than [`MAX_LAG`] behind it, those fragments are dropped and the keyframe goes next (the
//! viewer jumps to live); when a fragment would take its unsent bytes past [`VIEWER_BYTES`],
//! every fragment not begun is dropped and nothing more goes until the next keyframe. Each is
//! a skip, counted. A fragment begun is always finished: the stream stays well-formed.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::packets::fmp4::TIMESCALE;

/// Unsent bytes a viewer may have: past them it is skipped to the next keyframe. More than the
/// group of pictures a new viewer is sent at once (`packets::video::GOP_BYTES`).
pub(super) const VIEWER_BYTES: usize = crate::packets::video::GOP_BYTES + 4 * 1024 * 1024;
/// How far behind the newest keyframe a viewer's oldest fragment not begun may be, in ticks of
/// the stream (1 s): past that the viewer skips to that keyframe.
pub(super) const MAX_LAG: u64 = TIMESCALE as u64;
/// The kernel's send buffer of a viewer's socket (Linux doubles it): bytes in it are lag that
/// no skip can take back, and left to itself the kernel grows it to 4 MiB (`tcp_wmem`), tens
/// of seconds of a camera's sub-stream. 512 KiB still carry 40 Mbit/s over a 100 ms round trip.
pub(super) const SOCKET_BUFFER: libc::c_int = 256 * 1024;
/// How long a viewer may take no byte while it has some to take: it is gone (a page that
/// stopped reading without closing), and closed.
pub(super) const STALLED: Duration = Duration::from_secs(30);

/// A fragment of the stream, made once for all its viewers.
#[derive(Debug, Clone)]
pub(super) struct Piece {
    pub bytes: Arc<[u8]>,
    pub keyframe: bool,
    /// Its decoding time, in ticks.
    pub time: u64,
}

/// One message to send.
#[derive(Debug)]
struct Chunk {
    /// What frames it (a WebSocket frame's header; empty for plain HTTP).
    prefix: Vec<u8>,
    body: Arc<[u8]>,
    /// The fragment's decoding time; `None` for what is never dropped (a head, an init).
    time: Option<u64>,
}

impl Chunk {
    fn len(&self) -> usize {
        self.prefix.len() + self.body.len()
    }
}

/// How the viewer's messages are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// One HTTP response, its body the stream's bytes until the connection closes.
    Http,
    /// WebSocket binary messages, one per segment (`ws.rs`).
    WebSocket,
}

/// What became of a fragment offered to a viewer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Took {
    Queued,
    /// Not queued: the viewer waits for a keyframe.
    Passed,
    /// The viewer was skipped (counted): fragments it had not begun were dropped.
    Skipped,
}

#[derive(Debug)]
pub(super) struct Viewer {
    pub stream: TcpStream,
    pub framing: Framing,
    queue: VecDeque<Chunk>,
    /// Bytes of the front chunk written.
    sent: usize,
    /// Bytes of the queue not yet written.
    unsent: usize,
    /// Waits for a keyframe after a skip.
    skipping: bool,
    /// When the socket last took a byte, or had none to take.
    last_taken: Instant,
}

impl Viewer {
    pub(super) fn new(stream: TcpStream, framing: Framing) -> Self {
        bound_send_buffer(&stream);
        Self {
            stream,
            framing,
            queue: VecDeque::new(),
            sent: 0,
            unsent: 0,
            skipping: false,
            last_taken: Instant::now(),
        }
    }

    /// Queues a message that is never dropped (a head, an init segment, a text message).
    pub(super) fn queue_message(&mut self, body: Arc<[u8]>, text: bool) {
        self.push(body, None, text);
    }

    /// Queues bytes that go as they are, never framed as a message (a response head).
    pub(super) fn queue_raw(&mut self, bytes: Vec<u8>) {
        self.push_chunk(Chunk {
            prefix: Vec::new(),
            body: bytes.into(),
            time: None,
        });
    }

    fn push(&mut self, body: Arc<[u8]>, time: Option<u64>, text: bool) {
        let prefix = match self.framing {
            Framing::Http => Vec::new(),
            Framing::WebSocket => super::ws::frame_header(body.len(), text),
        };
        self.push_chunk(Chunk { prefix, body, time });
    }

    fn push_chunk(&mut self, chunk: Chunk) {
        self.unsent += chunk.len();
        self.queue.push_back(chunk);
    }

    /// Offers a fragment (see the module header for what is dropped).
    pub(super) fn offer(&mut self, piece: &Piece) -> Took {
        let mut took = Took::Queued;
        if self.skipping && !piece.keyframe {
            return Took::Passed;
        }
        if piece.keyframe
            && self
                .oldest_not_begun()
                .is_some_and(|t| piece.time.saturating_sub(t) > MAX_LAG)
        {
            self.drop_not_begun();
            took = Took::Skipped;
        }
        if self.unsent + piece.bytes.len() > VIEWER_BYTES {
            self.drop_not_begun();
            self.skipping = true;
            return Took::Skipped;
        }
        self.skipping = false;
        self.push(piece.bytes.clone(), Some(piece.time), false);
        took
    }

    /// The decoding time of the oldest fragment not begun.
    fn oldest_not_begun(&self) -> Option<u64> {
        let begun = usize::from(self.sent > 0);
        self.queue.iter().skip(begun).find_map(|c| c.time)
    }

    /// Drops every fragment not begun (heads and init segments stay).
    fn drop_not_begun(&mut self) {
        let begun = usize::from(self.sent > 0);
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for (i, chunk) in self.queue.drain(..).enumerate() {
            if i < begun || chunk.time.is_none() {
                kept.push_back(chunk);
            } else {
                self.unsent -= chunk.len();
            }
        }
        self.queue = kept;
    }

    /// Whether a WebSocket's peer sent its close message or ended the connection (its other
    /// messages are read and dropped; a page sends none).
    fn closed_by_peer(&mut self) -> bool {
        let mut buf = [0u8; 256];
        match std::io::Read::read(&mut self.stream, &mut buf) {
            Ok(0) => true,
            Ok(_) => buf[0] & 0x0f == super::ws::CLOSE,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }

    /// Bytes not yet written.
    pub(super) fn unsent(&self) -> usize {
        self.unsent
    }

    /// Writes what the socket takes now; `Ok(bytes written)`, or `Err` when the viewer went
    /// (or took nothing for [`STALLED`]).
    pub(super) fn flush(&mut self) -> Result<usize, ()> {
        if self.framing == Framing::WebSocket && self.closed_by_peer() {
            return Err(());
        }
        let mut written = 0;
        while let Some(front) = self.queue.front() {
            let (prefix, body) = (front.prefix.len(), front.body.len());
            let rest = if self.sent < prefix {
                &front.prefix[self.sent..]
            } else {
                &front.body[self.sent - prefix..]
            };
            match self.stream.write(rest) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    written += n;
                    self.sent += n;
                    self.unsent -= n;
                    if self.sent == prefix + body {
                        self.queue.pop_front();
                        self.sent = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
        if written > 0 || self.queue.is_empty() {
            self.last_taken = Instant::now();
        } else if self.last_taken.elapsed() >= STALLED {
            return Err(());
        }
        Ok(written)
    }
}

/// Sets the socket's send buffer to [`SOCKET_BUFFER`]; where refused, the kernel's stays.
fn bound_send_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size = SOCKET_BUFFER;
    // SAFETY: setsockopt reads the int we pass by pointer, with its size.
    let set = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "live video: the socket's send buffer stays the kernel's");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A viewer whose peer reads nothing, its socket's send buffer small.
    fn viewer() -> (Viewer, TcpStream) {
        use std::os::fd::AsRawFd;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().unwrap();
        stream.set_nonblocking(true).unwrap();
        let viewer = Viewer::new(stream, Framing::Http);
        let size: libc::c_int = 8 * 1024;
        // SAFETY: setsockopt reads the int we pass by pointer, with its size.
        let set = unsafe {
            libc::setsockopt(
                viewer.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&raw const size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        (viewer, peer)
    }

    fn piece(keyframe: bool, time: u64, size: usize) -> Piece {
        Piece {
            bytes: vec![0; size].into(),
            keyframe,
            time,
        }
    }

    #[test]
    fn a_viewer_behind_by_more_than_the_lag_jumps_to_the_next_keyframe() {
        let (mut v, _peer) = viewer();
        v.queue_message(vec![1; 10].into(), false);
        let frame = u64::from(TIMESCALE) / 25;
        for n in 0..25 {
            assert_eq!(v.offer(&piece(n == 0, n * frame, 100)), Took::Queued);
        }
        // Nothing written yet: 25 frames (1 s) wait; a keyframe 1 s after the first is
        // within the lag, one later is not.
        assert_eq!(v.offer(&piece(true, 25 * frame, 100)), Took::Queued);
        assert_eq!(v.offer(&piece(true, 26 * frame, 100)), Took::Skipped);
        // The head stays, and the keyframe follows it.
        assert_eq!(v.queue.len(), 2);
        assert_eq!(v.unsent(), 110);
        assert_eq!(v.queue[1].time, Some(26 * frame));
    }

    #[test]
    fn a_viewer_past_its_bytes_takes_nothing_until_the_next_keyframe() {
        let (mut v, _peer) = viewer();
        let big = VIEWER_BYTES / 4;
        for n in 0..4 {
            assert_eq!(v.offer(&piece(n == 0, n, big)), Took::Queued);
        }
        assert_eq!(v.offer(&piece(false, 4, 10)), Took::Skipped);
        assert_eq!(v.unsent(), 0);
        assert_eq!(v.offer(&piece(false, 5, 10)), Took::Passed);
        assert_eq!(v.offer(&piece(true, 6, 10)), Took::Queued);
        assert_eq!(v.unsent(), 10);
    }

    #[test]
    fn a_fragment_begun_is_finished_before_a_skip() {
        let (mut v, peer) = viewer();
        v.offer(&piece(true, 0, 4 * 1024 * 1024));
        // The socket takes part of it; the rest waits.
        v.flush().unwrap();
        assert!(v.sent > 0 && v.unsent() > 0);
        let left = v.unsent();
        v.offer(&piece(false, 1, 10));
        assert_eq!(v.offer(&piece(true, 2 * MAX_LAG, 10)), Took::Skipped);
        assert_eq!(v.unsent(), left + 10);
        drop(peer.shutdown(std::net::Shutdown::Both));
    }
}
