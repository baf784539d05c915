//! The source stage: one supervised GStreamer pipeline per source, decoding to BGR frames.
//!
//! Threads, per source: a supervisor (`vidflow-source-NAME`) builds the pipeline, blocks on its
//! bus until the stream ends, fails, stalls or is asked to stop, tears it down completely, and
//! rebuilds it after a backoff when the source is live (or loops). GStreamer's streaming thread
//! runs the appsink callback, which wraps each decoded buffer as a [`Frame`] (no copy, unless
//! the source's frames hold as many buffers as the decoder's pool can spare: `frame::Pins`) and
//! puts it into this source's own bounded channel (capacity `queue`): a file waits for room, a
//! live source drops its oldest queued frame and counts it, so it stays current.
//!
//! Stop protocol: [`SourceControl::stop`] records the request (`request`, only ever raised),
//! wakes a backoff wait through the `wake` channel (capacity 1) and a bus wait through an
//! application message; a request made while a pipeline is being built is delivered once its bus
//! is known. A stop wins in every state: between attempts the supervisor returns at once; a
//! connection that has not given a frame yet (starting, connecting, set up to a server that does
//! not answer) has nothing to drain and is stopped hard at once (an EOS sent to an `rtspsrc`
//! whose streams do not exist yet would be lost); a streaming pipeline gets EOS and still
//! delivers what it decoded, for at most [`STOP_GRACE`] after the request, then it is stopped
//! hard; an error after a request ends it instead of reconnecting. [`SourceControl::abort`]
//! stops hard at once. When the supervisor ends, the pipeline is down and the frame sender is
//! dropped (the consumer sees the channel close after the last frame), then its result is sent
//! on `ended`, so that [`SourceHandle::join_until`] can give up on a supervisor blocked in
//! GStreamer (a state change waiting on a TCP connect) at a deadline.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use gstreamer as gst;
use serde::Serialize;

use crate::frame::{Format, Frame};

mod cut;
mod device;
mod ended;
mod last_error;
mod options;
mod pipeline;
mod publish;
mod record;
mod rtcp;
mod stream;
mod supervisor;
mod teardown;
mod uri;
mod video;

pub use last_error::LastError;
pub use options::{
    Backoff, Credentials, FRAME_PIXELS_LIMIT, LiveVideo, MAX_FRAME_PIXELS, Reconnect, Secret,
    SourceOptions, Transport,
};
pub use pipeline::describe;
pub use uri::{CameraFormat, SourceUri, TestPattern, UriError, redact};

/// One `[sources.NAME]` table, checked: what [`start`] needs to run the source.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    pub name: Arc<str>,
    pub uri: SourceUri,
    pub options: SourceOptions,
    /// Byte range of the `uri` value in the pipeline file, for problems found later.
    pub uri_span: std::ops::Range<usize>,
    /// The stream whose packets are recorded as sent (`record_uri`, else `uri`), when a sink
    /// records this source; `None`: nothing records it, no second stream is opened.
    pub record: Option<SourceUri>,
}

/// How long a streaming source may take, after a stop request, to deliver what it decoded and
/// end its stream before it is stopped hard: the decoder's few queued frames take milliseconds;
/// this is for a slow workflow holding a file's streaming thread, well inside the stop deadline.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Why a source could not start or ended badly. Messages never contain a password.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    #[error("source \"{name}\" ({uri}): {reason}")]
    Unavailable {
        name: String,
        uri: String,
        reason: String,
    },
    #[error("source \"{name}\" ({uri}): element \"{element}\": {message}{}", debug_suffix(.debug))]
    Stream {
        name: String,
        uri: String,
        element: String,
        message: String,
        debug: Option<String>,
    },
    #[error(
        "source \"{name}\" ({uri}): gave up after {attempts} reconnection attempts; last: {last}"
    )]
    GaveUp {
        name: String,
        uri: String,
        attempts: u32,
        last: String,
    },
    #[error("source \"{name}\": gstreamer: {message}")]
    Gstreamer { name: String, message: String },
    #[error(
        "source \"{name}\" ({uri}): the file gave {decoded} of its {expected} frames (its \
         duration at its frame rate); the rest could not be decoded: a truncated or damaged file?"
    )]
    Incomplete {
        name: String,
        uri: String,
        decoded: u64,
        expected: u64,
    },
}

fn debug_suffix(debug: &Option<String>) -> String {
    debug
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default()
}

/// Counters of one source. Written by its streaming and supervisor threads, read by anyone
/// (relaxed: they are statistics, not synchronisation).
#[derive(Debug, Default)]
pub struct SourceCounters {
    /// Frames that left the decoder and were accepted into vidflow.
    pub decoded: AtomicU64,
    /// Decoded frames that never reached the workflow (live queue overflow, hard stop).
    pub dropped: AtomicU64,
    /// Times the stream came back after a loss.
    pub reconnects: AtomicU64,
    /// Times the frames changed size or frame rate (a camera reconfigured or back at another
    /// size, a file whose caps change mid-stream).
    pub size_changes: AtomicU64,
    /// Pipelines started (the first connection and every retry).
    pub attempts: AtomicU64,
    /// Frames discarded by `max_fps` before conversion.
    pub throttled: AtomicU64,
    /// Frames copied out of the decoder's buffer because the source's frames held as many of
    /// its buffers as its pool allows (`frame::Pins`).
    pub copied: AtomicU64,
    /// Connections cut because their server held the pipeline's teardown (`teardown.rs`).
    pub cut: AtomicU64,
    /// Pipelines left behind, still going down on a thread of their own, because their
    /// teardown did not end (`teardown.rs`).
    pub abandoned: AtomicU64,
    /// Frames a file holds (its duration at its frame rate) that it did not give: set at its
    /// end when they are more than rounding explains (`supervisor::shortfall`).
    pub missing: AtomicU64,
    /// A [`SourceState`] as `u8`. Written by the supervisor (losses, the end) and the streaming
    /// thread (a frame after a loss), read by observers.
    state: AtomicU8,
    /// When the last frame arrived, in ms after [`monotonic_ms`]'s epoch, plus one (0: none
    /// yet). Written by the streaming thread, read by observers (health).
    last_frame_ms: AtomicU64,
    /// When the source started, in ms after [`monotonic_ms`]'s epoch. Written once by
    /// [`start_from`] before any thread reads it.
    started_ms: AtomicU64,
    /// Frames a file will give (its duration times its frame rate, at most `max_frames`); 0
    /// while unknown, and for what is not a file or loops. Written by the streaming thread once
    /// the stream is up (first frame), read by observers (the progress bar).
    total: AtomicU64,
    /// Why the stream was last lost (`last_error.rs`).
    last_error: Mutex<Option<LastError>>,
    /// The camera's clock minus this computer's, ns, at its latest RTCP sender report
    /// (`rtcp.rs`); meaningful once `skew_known`. Written by the GStreamer thread that
    /// receives the reports, read by observers (health, metrics).
    clock_skew_ns: AtomicI64,
    skew_known: AtomicBool,
}

/// Where a source is, for observers (metrics, health).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    /// Before its first frame.
    Connecting,
    /// Frames arrive.
    Streaming,
    /// Lost (error or end of a live stream); waiting to reconnect, or reconnecting.
    Retrying,
    /// No frame for `stall_timeout`: torn down, waiting to reconnect, or reconnecting.
    Stalled,
    /// The supervisor has returned: end of file, a stop, or it gave up.
    Ended,
}

impl SourceState {
    pub const ALL: [Self; 5] = [
        Self::Connecting,
        Self::Streaming,
        Self::Retrying,
        Self::Stalled,
        Self::Ended,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Streaming => "streaming",
            Self::Retrying => "retrying",
            Self::Stalled => "stalled",
            Self::Ended => "ended",
        }
    }
}

/// Milliseconds on a monotonic clock whose epoch is its first use in the process.
fn monotonic_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A snapshot of [`SourceCounters`] for reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SourceStats {
    pub decoded: u64,
    pub dropped: u64,
    pub reconnects: u64,
    pub size_changes: u64,
    pub attempts: u64,
    pub throttled: u64,
    pub copied: u64,
    pub cut: u64,
    pub abandoned: u64,
    pub missing: u64,
}

impl SourceCounters {
    pub fn state(&self) -> SourceState {
        SourceState::ALL
            .get(usize::from(self.state.load(Ordering::Relaxed)))
            .copied()
            .unwrap_or(SourceState::Ended)
    }

    fn set_state(&self, state: SourceState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// On the streaming thread, for each frame accepted: one store, and one more after a loss.
    fn frame_arrived(&self) {
        self.last_frame_ms
            .store(monotonic_ms().saturating_add(1), Ordering::Relaxed);
        if self.state.load(Ordering::Relaxed) != SourceState::Streaming as u8 {
            self.set_state(SourceState::Streaming);
        }
    }

    /// Frames the source will give, when known (see `total`).
    pub fn total(&self) -> Option<u64> {
        match self.total.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// Sets the camera's clock skew (ns, its clock minus this computer's) of its latest sender
    /// report.
    pub fn set_clock_skew(&self, ns: i64) {
        self.clock_skew_ns.store(ns, Ordering::Relaxed);
        self.skew_known.store(true, Ordering::Relaxed);
    }

    /// The camera's clock minus this computer's, seconds, at its latest RTCP sender report;
    /// `None` before the first (or for a source that sends none).
    pub fn clock_skew_s(&self) -> Option<f64> {
        self.skew_known
            .load(Ordering::Relaxed)
            .then(|| self.clock_skew_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }

    /// How long ago the last frame arrived; `None` before the first.
    pub fn since_last_frame(&self) -> Option<Duration> {
        match self.last_frame_ms.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(monotonic_ms().saturating_sub(at - 1))),
        }
    }

    /// How long the source has given no frame: since its last one, or since it started.
    pub fn quiet_for(&self) -> Duration {
        self.since_last_frame().unwrap_or_else(|| {
            let started = self.started_ms.load(Ordering::Relaxed);
            Duration::from_millis(monotonic_ms().saturating_sub(started))
        })
    }

    pub fn snapshot(&self) -> SourceStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SourceStats {
            decoded: get(&self.decoded),
            dropped: get(&self.dropped),
            reconnects: get(&self.reconnects),
            size_changes: get(&self.size_changes),
            attempts: get(&self.attempts),
            throttled: get(&self.throttled),
            copied: get(&self.copied),
            cut: get(&self.cut),
            abandoned: get(&self.abandoned),
            missing: get(&self.missing),
        }
    }
}

const RUN: u8 = 0;
const STOP: u8 = 1;
const ABORT: u8 = 2;
const CONTROL_MESSAGE: &str = "vidflow-control";

/// State shared by a source's supervisor, its streaming thread and its controls.
#[derive(Debug)]
struct Shared {
    name: Arc<str>,
    uri: SourceUri,
    options: SourceOptions,
    max_frames: Option<u64>,
    counters: Arc<SourceCounters>,
    /// RUN, STOP or ABORT; only ever raised. Written by controls, read by everyone.
    request: AtomicU8,
    /// Wakes the supervisor out of a backoff wait.
    wake: (Sender<()>, Receiver<()>),
    /// Bus of the pipeline running now, to wake the supervisor out of a bus wait.
    bus: Mutex<Option<gst::Bus>>,
    /// Number of the next frame; written by the streaming thread of the pipeline running now.
    seq: AtomicU64,
    /// When the last frame arrived, in ns after `epoch` (0: none yet). Written by the
    /// streaming thread, read by the supervisor for stall detection.
    last_frame: AtomicU64,
    epoch: Instant,
    /// Added to the timestamps of the pipeline running now, in ns: each new pipeline (a file
    /// looping, a stream reconnecting) starts its timestamps again near zero, and frames carry
    /// them on from where the previous one ended, as they do frame numbers (a video sink would
    /// otherwise see time go back). Written by `Connection::open` before the pipeline starts,
    /// read by its streaming thread.
    pts_offset: AtomicU64,
    /// The end (timestamp plus one frame) of the last frame delivered, offset included, in ns.
    /// Written by the streaming thread, read by `Connection::open`.
    pts_end: AtomicU64,
    /// Set by the supervisor after a loss; the first frame of the next pipeline clears it and
    /// counts the reconnection.
    reconnecting: AtomicBool,
    /// Set by the streaming thread at the source's first copied frame, which it logs.
    copying: AtomicBool,
    /// The format of the frames delivered last, across reconnections, to count and log a
    /// change. Written and read by the streaming thread of the pipeline running now, when its
    /// caps change (so at most once per connection and caps, never per frame).
    format: Mutex<Option<Format>>,
    /// Set for a record stream (`record.rs`): its pipeline parses instead of decoding, and its
    /// packets go to this topic instead of frames to the queue.
    packets: Option<Arc<crate::packets::Topic>>,
}

impl Shared {
    fn request(&self) -> u8 {
        self.request.load(Ordering::Acquire)
    }

    fn raise(&self, level: u8) {
        self.request.fetch_max(level, Ordering::AcqRel);
        let _ = self.wake.0.try_send(());
        let bus = self.bus.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bus) = bus.as_ref() {
            // Fails only when the bus is flushing: that pipeline is going down anyway.
            let _ = bus.post(gst::message::Application::new(gst::Structure::new_empty(
                CONTROL_MESSAGE,
            )));
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// When the last frame arrived, if any did.
    fn last_frame_at(&self) -> Option<Instant> {
        match self.last_frame.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }

    fn unavailable(&self, reason: impl Into<String>) -> SourceError {
        SourceError::Unavailable {
            name: self.name.to_string(),
            uri: self.uri.to_string(),
            reason: reason.into(),
        }
    }
}

/// A running source.
#[derive(Debug)]
pub struct SourceHandle {
    shared: Arc<Shared>,
    /// The record stream's state, when the source records (`record.rs`).
    record: Option<Arc<Shared>>,
    thread: JoinHandle<()>,
    /// The supervisor's result, sent as its last act: lets [`SourceHandle::join_until`] wait
    /// with a deadline (a `JoinHandle` cannot).
    ended: Receiver<Result<(), SourceError>>,
    /// Never carries a message: it disconnects when the supervisor has ended (see
    /// [`SourceHandle::done`]).
    done: Receiver<()>,
}

/// Stops a running source from any thread.
#[derive(Debug, Clone)]
pub struct SourceControl {
    shared: Arc<Shared>,
    record: Option<Arc<Shared>>,
}

impl SourceControl {
    /// Asks the source to end its stream; frames already decoded are still delivered.
    pub fn stop(&self) {
        self.shared.raise(STOP);
        if let Some(record) = &self.record {
            record.raise(STOP);
        }
    }

    /// Stops the source at once.
    pub fn abort(&self) {
        self.shared.raise(ABORT);
        if let Some(record) = &self.record {
            record.raise(ABORT);
        }
    }
}

/// Where a source started again under the same name (a reload changed its settings) carries on
/// from: its predecessor's next frame number and the end of its last timestamp, so that frame
/// numbers and time keep going up for everything downstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resume {
    pub seq: u64,
    pub pts_end_ns: u64,
}

/// Starts a source. Frames go into `frames`; at most `max_frames` are accepted. Fails at once
/// if the source cannot be opened at all (missing file or camera); a live source that cannot
/// connect yet is retried in the background.
pub fn start(
    config: &SourceConfig,
    frames: Sender<Frame>,
    frames_rx: &Receiver<Frame>,
    max_frames: Option<u64>,
) -> Result<SourceHandle, SourceError> {
    start_from(config, frames, frames_rx, max_frames, Resume::default())
}

/// Checks what [`start`] checks before it starts anything (the file or camera device exists).
pub fn check(config: &SourceConfig) -> Result<(), SourceError> {
    stream::preflight_uri(&config.name, &config.uri)
}

/// Like [`start`], numbering frames from `resume.seq` and timing them from `resume.pts_end_ns`.
pub fn start_from(
    config: &SourceConfig,
    frames: Sender<Frame>,
    frames_rx: &Receiver<Frame>,
    max_frames: Option<u64>,
    resume: Resume,
) -> Result<SourceHandle, SourceError> {
    crate::gst_setup::init().map_err(|message| SourceError::Gstreamer {
        name: config.name.to_string(),
        message,
    })?;
    let shared = Arc::new(Shared::new(
        config.name.clone(),
        config.uri.clone(),
        config.options.clone(),
        max_frames,
        resume,
        None,
    ));
    stream::preflight(&shared)?;
    let record = match &config.record {
        Some(uri) => Some(record::RecordStream::start(config, uri)?),
        None => None,
    };
    let record_shared = record.as_ref().map(|r| r.shared().clone());
    // A live source drops its oldest queued frame to make room: it needs the receiving end.
    let oldest = shared.uri.is_live().then(|| frames_rx.clone());
    let (ended_tx, ended) = crossbeam_channel::bounded(1);
    let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("vidflow-source-{}", config.name))
            .spawn(move || {
                let result = supervisor::supervise(&shared, &frames, oldest.as_ref());
                if let Some(record) = record {
                    record.finish(&shared, result.is_ok());
                }
                shared.counters.set_state(SourceState::Ended);
                // The frame sender goes first: the consumer sees the channel close.
                drop(frames);
                let _ = ended_tx.send(result);
                drop(done_tx);
            })
            .map_err(|e| SourceError::Gstreamer {
                name: config.name.to_string(),
                message: format!("cannot spawn source thread: {e}"),
            })?
    };
    tracing::info!(source = %config.name, uri = %config.uri, "source started");
    Ok(SourceHandle {
        shared,
        record: record_shared,
        thread,
        ended,
        done,
    })
}

impl Shared {
    fn new(
        name: Arc<str>,
        uri: SourceUri,
        options: SourceOptions,
        max_frames: Option<u64>,
        resume: Resume,
        packets: Option<Arc<crate::packets::Topic>>,
    ) -> Self {
        Self {
            name,
            uri,
            options,
            max_frames,
            counters: Arc::new(SourceCounters {
                started_ms: AtomicU64::new(monotonic_ms()),
                ..SourceCounters::default()
            }),
            request: AtomicU8::new(RUN),
            wake: crossbeam_channel::bounded(1),
            bus: Mutex::new(None),
            seq: AtomicU64::new(resume.seq),
            last_frame: AtomicU64::new(0),
            epoch: Instant::now(),
            pts_offset: AtomicU64::new(resume.pts_end_ns),
            pts_end: AtomicU64::new(resume.pts_end_ns),
            reconnecting: AtomicBool::new(false),
            copying: AtomicBool::new(false),
            format: Mutex::new(None),
            packets,
        }
    }
}

impl SourceHandle {
    pub fn control(&self) -> SourceControl {
        SourceControl {
            shared: self.shared.clone(),
            record: self.record.clone(),
        }
    }

    pub fn counters(&self) -> &Arc<SourceCounters> {
        &self.shared.counters
    }

    /// The counters of the record stream (its own state, reconnections and stalls; `decoded`
    /// counts its packets), when the source records.
    pub fn record_counters(&self) -> Option<&Arc<SourceCounters>> {
        self.record.as_ref().map(|r| &r.counters)
    }

    pub fn name(&self) -> &Arc<str> {
        &self.shared.name
    }

    pub fn options(&self) -> &SourceOptions {
        &self.shared.options
    }

    /// Where a successor of this source would carry on from (see [`Resume`]); final once the
    /// source has ended.
    pub fn resume_point(&self) -> Resume {
        Resume {
            seq: self.shared.seq.load(Ordering::Relaxed),
            pts_end_ns: self.shared.pts_end.load(Ordering::Acquire),
        }
    }

    pub fn uri(&self) -> &SourceUri {
        &self.shared.uri
    }

    /// A channel that disconnects once the source has ended (its result is then ready for
    /// [`SourceHandle::join`]): for a `select` that must also notice sources ending.
    pub fn done(&self) -> Receiver<()> {
        self.done.clone()
    }

    /// Waits for the supervisor; the pipeline is down when this returns.
    pub fn join(self) -> Result<(), SourceError> {
        let name = self.shared.name.to_string();
        let result = self.ended.recv().unwrap_or_else(|_| {
            Err(SourceError::Gstreamer {
                name,
                message: "source thread panicked".to_owned(),
            })
        });
        let _ = self.thread.join();
        result
    }

    /// Waits for the supervisor until `deadline`. Past it the thread is abandoned (detached,
    /// never joined) and `None` is returned: a GStreamer call that blocks (a TCP connect to a
    /// host that does not answer) cannot hold the caller.
    pub fn join_until(self, deadline: Instant) -> Option<Result<(), SourceError>> {
        let name = self.shared.name.to_string();
        match self.ended.recv_deadline(deadline) {
            Ok(result) => {
                let _ = self.thread.join();
                Some(result)
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                let _ = self.thread.join();
                Some(Err(SourceError::Gstreamer {
                    name,
                    message: "source thread panicked".to_owned(),
                }))
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
        }
    }
}
