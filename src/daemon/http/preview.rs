//! `/preview/SOURCE`: an MJPEG stream (`multipart/x-mixed-replace`) of what the source's
//! `preview` sink publishes, on a thread of its own (`vidflow-http-preview`, at most
//! [`MAX_PREVIEWS`](super::MAX_PREVIEWS)). The client holds a `Watch` while connected, so the
//! sink encodes only then; each JPEG is written and flushed as it comes.
//!
//! The watcher waits on the hub's condvar for at most [`WATCH_TICK`] at a time; a JPEG, the
//! hub's wake-up (a preview sink closed, the run stopping) or the tick lets it check, and it
//! ends when:
//! - the run stops (`Shared::stop`);
//! - the client went: its socket reads end-of-file or fails (checked at each quiet tick; while
//!   JPEGs flow, a failed or timed-out write ends it);
//! - no JPEG came for [`STALL_LIMIT`] (or [`STALL_INTERVALS`] of the sink's `max_fps`
//!   interval, if longer): the source stalled, and the client may reconnect;
//! - no preview sink takes the source any more (a reload removed it).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{MAX_PREVIEWS, Shared};
use crate::daemon::live::Parts;
use crate::sinks::preview::hub;

const BOUNDARY: &str = "vidflowframe";
/// The longest a watcher sleeps between its checks for a lost client or a removed sink.
pub(super) const WATCH_TICK: Duration = Duration::from_millis(500);
/// A stream with no JPEG for this long ends: its source has stalled.
const STALL_LIMIT: Duration = Duration::from_secs(5);
/// ... unless the sink's own interval between JPEGs (`max_fps`) makes this many of them longer.
const STALL_INTERVALS: u32 = 3;
/// How long one write may block: a preview client that stopped reading is let go.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a preview sink open now takes the frames of `source`.
pub(super) fn available(parts: &Parts, source: &str) -> bool {
    parts
        .sinks
        .iter()
        .any(|s| hub().is_preview_sink(&s.name) && s.sender.takes(source))
}

/// `Err` with a 404's body when there is nothing to stream.
pub(super) fn check(parts: &Parts, source: &str) -> Result<(), String> {
    if !parts.sources.iter().any(|s| &*s.name == source) {
        return Err(format!("no source \"{source}\"\n"));
    }
    if !available(parts, source) {
        return Err(format!(
            "source \"{source}\" has no preview sink: add one, e.g. [sinks.preview] kind = \"preview\", image = \"$frame\"\n"
        ));
    }
    Ok(())
}

/// Counts a preview thread while it lives.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.previews.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts streaming on a thread of its own, or answers 503 when [`MAX_PREVIEWS`] stream.
pub(super) fn start(mut stream: TcpStream, shared: &Arc<Shared>, source: String) {
    if shared.previews.fetch_add(1, Ordering::AcqRel) >= MAX_PREVIEWS {
        shared.previews.fetch_sub(1, Ordering::AcqRel);
        let busy = super::refusal(503, "too many preview streams; try again later\n");
        // Non-blocking and short: it fits the socket's buffer or is lost with the connection.
        let _ = stream.write(&busy);
        return;
    }
    let slot = Slot(shared.clone());
    let spawned = std::thread::Builder::new()
        .name("vidflow-http-preview".to_owned())
        .spawn(move || {
            if let Err(e) = watch(stream, &slot.0, &source) {
                tracing::debug!(error = %e, source, "preview stream ended");
            }
            drop(slot);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "http: cannot start a preview thread");
    }
}

/// Streams the source's JPEGs until one of the module's ends.
fn watch(mut stream: TcpStream, shared: &Shared, source: &str) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary={BOUNDARY}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    stream.flush()?;
    let channel = hub().channel(source);
    let mut watch = channel.watch();
    let mut last_jpeg = Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(jpeg) = watch.next(WATCH_TICK) {
            last_jpeg = Instant::now();
            let part = format!(
                "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
                jpeg.len()
            );
            stream.write_all(part.as_bytes())?;
            stream.write_all(&jpeg)?;
            stream.write_all(b"\r\n")?;
            stream.flush()?;
            continue;
        }
        let stall = STALL_LIMIT.max(channel.interval() * STALL_INTERVALS);
        if last_jpeg.elapsed() >= stall {
            tracing::debug!(source, "preview: no JPEG for {stall:?}; stream ended");
            return Ok(());
        }
        if !available(&shared.live.parts(), source) {
            tracing::debug!(
                source,
                "preview: no preview sink takes the source now; stream ended"
            );
            return Ok(());
        }
        if client_gone(&mut stream)? {
            return Ok(());
        }
    }
}

/// Whether the client closed its side (or the connection failed); anything it sent is dropped.
fn client_gone(stream: &mut TcpStream) -> std::io::Result<bool> {
    stream.set_nonblocking(true)?;
    let mut scratch = [0u8; 512];
    let gone = match stream.read(&mut scratch) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    };
    stream.set_nonblocking(false)?;
    Ok(gone)
}
