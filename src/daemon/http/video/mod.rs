//! `/api/video/SOURCE`: a source's own H.264 or H.265, never re-encoded (or, for a source with
//! neither, its frames encoded to H.264 while it is watched), as fragmented MP4 for a
//! browser's Media Source Extensions: an init segment, then a fragment per picture, from the
//! last keyframe the source kept (so the first picture comes at once), over one long-lived
//! connection: a plain HTTP response (`Content-Type: video/mp4`, the codec and the time origin
//! in headers), or, asked with `Upgrade: websocket`, WebSocket messages (the same, the headers'
//! facts in a first text message; `ws.rs` says why). The packets are the decoded stream's
//! (`packets::video`, published by the source's decoder input): no second camera connection.
//! The contract, with each frame's `media_time` in `/api/live` that finds its boxes, is in
//! docs/reference/api.json and docs/guides/events-and-page.md ("Live video").
//!
//! One thread, `vidflow-http-video`, holds every viewer's socket, non-blocking, like the live
//! thread (`live.rs`): it waits on its arrivals, its stop channel and the subscription of each
//! watched source ([`broadcast::Broadcast`], made at its first viewer, dropped after its last,
//! so a source nobody watches costs no wake-up), makes each packet's fragment once, queues it
//! for every viewer of its source (shared, not copied) and writes what each socket takes. A
//! viewer is never waited for: one that falls behind is skipped to the next keyframe (counted),
//! the others are not slowed (`viewer.rs`). While a socket has not taken all it is owed, the
//! thread wakes every [`BACKLOG_TICK`] to write more (a picture is 40 ms at 25 fps); otherwise it
//! sleeps until a packet, an arrival or the stop. Viewers count against the live clients' cap
//! (`live.rs`: from the file-descriptor limit, `daemon::fds`), the two together; past it, 503.
//! The thread runs below the frame path's priority, as the live thread does. A watched source
//! with no H.264 of its own has its frames encoded, once for all its viewers, by an encoder the
//! thread starts and stops (`encoder.rs`: from its first viewer until a few seconds after its
//! last); a source whose `live_video` chose stills is refused (409), as one that cannot play.
//!
//! Stop protocol (`workers.rs`): dropping its [`Workers`] drops the stop channel's sender, which
//! wakes the thread; it closes every viewer and unsubscribes, and is joined.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Select, Sender, TrySendError, bounded};

use super::Shared;
use super::workers::Workers;
use crate::packets::video::Status;

mod broadcast;
mod encoder;
mod viewer;
mod ws;

/// Viewers waiting to be taken in by the thread: it takes them as fast as they come.
pub(super) const ARRIVALS: usize = 32;
/// How soon the thread tries again a socket that did not take all it was owed: well under a
/// picture's time, so a backlog drains before the next comes.
const BACKLOG_TICK: Duration = Duration::from_millis(10);
/// How soon it looks again at viewers waiting for a first keyframe (to answer them when the
/// source turns out to have no playable codec, or gives none).
const WAIT_TICK: Duration = Duration::from_secs(1);

/// A new viewer: its connection, the source it watches, and its `Sec-WebSocket-Key` when it
/// asked for a WebSocket.
#[derive(Debug)]
pub(super) struct Arrival {
    pub stream: TcpStream,
    pub source: String,
    pub ws_key: Option<String>,
}

pub(super) fn queue() -> (Sender<Arrival>, Receiver<Arrival>) {
    bounded(ARRIVALS)
}

/// Starts the video thread on `arrivals`; dropping the result stops and joins it.
pub(super) fn start(arrivals: Receiver<Arrival>, shared: Arc<Shared>) -> std::io::Result<Workers> {
    Workers::start("vidflow-http-video", 1, move |stopped| {
        run(&arrivals, stopped, &shared);
    })
}

/// Hands a viewer to the video thread, or answers 503.
pub(super) fn add(shared: &Shared, arrival: Arrival) {
    let Some(arrivals) = &shared.video else {
        return;
    };
    if let Err(TrySendError::Full(a) | TrySendError::Disconnected(a)) = arrivals.try_send(arrival) {
        let mut stream = a.stream;
        let _ = stream.write(&error(503, "too many viewers arriving; try again"));
    }
}

/// Why `source`, of `status`, plays no live video (answered 409); `None` when it plays (or may).
pub(super) fn refusal(source: &str, status: &Status) -> Option<String> {
    match status {
        Status::Not(why) => Some(format!(
            "source \"{source}\" has no H.264 or H.265 stream ({why}): the tile shows stills"
        )),
        Status::Stills => Some(format!(
            "source \"{source}\" shows stills (live_video = \"stills\")"
        )),
        Status::Waiting | Status::Playable(_) | Status::Encodable => None,
    }
}

/// A JSON error answer: `{"error": message}`.
pub(super) fn error(status: u16, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": message }).to_string();
    super::response(status, "application/json", body.as_bytes(), "")
}

/// What woke the thread.
enum Woke {
    Arrival(Arrival),
    Packet(usize, crate::packets::Carried),
    Tick,
    Stop,
}

fn run(arrivals: &Receiver<Arrival>, stopped: &Receiver<()>, shared: &Shared) {
    // Refused only by a system call filter: the live thread says so (once) for both.
    let _ = super::live::yield_to_the_frames();
    let mut casts: Vec<broadcast::Broadcast> = Vec::new();
    let mut encoders = encoder::Encoders::default();
    loop {
        let timeout = if casts.iter().any(broadcast::Broadcast::backlogged) {
            Some(BACKLOG_TICK)
        } else if casts.iter().any(broadcast::Broadcast::has_waiting) || encoders.idle() {
            Some(WAIT_TICK)
        } else {
            None
        };
        match wait(arrivals, stopped, &casts, timeout) {
            Woke::Stop => break,
            Woke::Arrival(a) => welcome(a, &mut casts, shared),
            Woke::Packet(i, item) => casts[i].carry(item),
            Woke::Tick => {}
        }
        for cast in &mut casts {
            // What came meanwhile goes out in the same writes.
            while let Ok(item) = cast.sub.packets.try_recv() {
                cast.carry(item);
            }
            cast.flush();
            cast.expire();
            let viewers = cast.count();
            cast.video.viewers.store(viewers as u64, Ordering::Relaxed);
            let queued = cast.unsent() as u64;
            cast.video.queued_bytes.store(queued, Ordering::Relaxed);
        }
        casts.retain(|c| c.count() > 0);
        encoders.keep(casts.iter().map(|c| (&c.source, &c.video)));
        let viewers = casts.iter().map(broadcast::Broadcast::count).sum();
        shared.video_viewers.store(viewers, Ordering::Relaxed);
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
    }
    for cast in &casts {
        cast.video.viewers.store(0, Ordering::Relaxed);
        cast.video.queued_bytes.store(0, Ordering::Relaxed);
    }
    shared.video_viewers.store(0, Ordering::Relaxed);
}

/// Waits for an arrival, a packet of a watched source, the stop, or `timeout`.
fn wait(
    arrivals: &Receiver<Arrival>,
    stopped: &Receiver<()>,
    casts: &[broadcast::Broadcast],
    timeout: Option<Duration>,
) -> Woke {
    let mut select = Select::new();
    select.recv(arrivals);
    select.recv(stopped);
    for cast in casts {
        select.recv(&cast.sub.packets);
    }
    let op = match timeout {
        Some(t) => match select.select_timeout(t) {
            Ok(op) => op,
            Err(_) => return Woke::Tick,
        },
        None => select.select(),
    };
    match op.index() {
        0 => op.recv(arrivals).map_or(Woke::Stop, Woke::Arrival),
        1 => {
            let _ = op.recv(stopped);
            Woke::Stop
        }
        i => match op.recv(&casts[i - 2].sub.packets) {
            Ok(item) => Woke::Packet(i - 2, item),
            // Never: the source holds the sender while the subscription lives.
            Err(_) => Woke::Tick,
        },
    }
}

/// Takes a viewer in: refused past the cap or for a source of neither H.264 nor H.265, else
/// handed to its source's broadcast (made at its first viewer).
fn welcome(a: Arrival, casts: &mut Vec<broadcast::Broadcast>, shared: &Shared) {
    let Arrival {
        mut stream,
        source,
        ws_key,
    } = a;
    let cap = shared.live.feed.max_clients.load(Ordering::Relaxed);
    let viewers: usize = casts.iter().map(broadcast::Broadcast::count).sum();
    if viewers + shared.live.feed.listeners() >= cap {
        shared.live.feed.refused.fetch_add(1, Ordering::Relaxed);
        let _ = stream.write(&error(503, "too many live clients; try again later"));
        return;
    }
    if let Some(why) = refusal(&source, &crate::packets::hub().video(&source).status()) {
        let _ = stream.write(&error(409, &why));
        return;
    }
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let framing = if ws_key.is_some() {
        viewer::Framing::WebSocket
    } else {
        viewer::Framing::Http
    };
    let viewer = viewer::Viewer::new(stream, framing);
    let at = match casts.iter().position(|c| *c.source == *source) {
        Some(at) => at,
        None => {
            casts.push(broadcast::Broadcast::new(source.into()));
            casts.len() - 1
        }
    };
    casts[at].welcome(viewer, ws_key.as_deref());
}
