//! The source stage: one GStreamer pipeline per source, decoding to BGR frames.
//!
//! Threads: GStreamer's streaming thread runs the appsink callback, which wraps each decoded
//! buffer as a [`Frame`] (no copy) and sends it into the frame channel; the channel is bounded
//! (the caller chooses its capacity), so a slow workflow makes a file source wait instead of
//! dropping. One bus thread per source (`vidflow-source-NAME`) owns the pipeline and blocks on
//! the bus: it ends on end of stream, on an error, or on a stop request.
//!
//! Stop protocol: [`SourceHandle::stop`] posts an application message on the bus; the bus
//! thread sends EOS into the pipeline and waits for it to come out at the appsink, so every
//! frame already decoded is delivered. If no frame moves for [`STOP_GRACE`] it gives up and
//! stops hard. [`SourceHandle::abort`] stops hard at once. Either way the bus thread sets the
//! pipeline to `Null` and drops the appsink callbacks, which drops the frame sender: the
//! consumer sees the channel close after the last frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use crate::config::SourceConfig;
use crate::frame::Frame;

mod pipeline;
mod uri;

pub use pipeline::describe;
pub use uri::{CameraFormat, SourceUri, TestPattern, UriError, redact};

/// How long a stopping source may go without delivering a frame before it is stopped hard.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

const STOP_MESSAGE: &str = "vidflow-stop";
const ABORT_MESSAGE: &str = "vidflow-abort";

/// Why a source could not start or ended badly. Messages never contain a password.
#[derive(Debug, thiserror::Error)]
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
    #[error("source \"{name}\": gstreamer: {message}")]
    Gstreamer { name: String, message: String },
}

fn debug_suffix(debug: &Option<String>) -> String {
    debug
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default()
}

/// Counters of one source. Written by the streaming thread, read by anyone (relaxed: they are
/// statistics, not synchronisation).
#[derive(Debug, Default)]
pub struct SourceCounters {
    /// Frames that left the decoder and were accepted into vidflow.
    pub decoded: AtomicU64,
    /// Decoded frames that never reached the workflow.
    pub dropped: AtomicU64,
}

/// A running source.
#[derive(Debug)]
pub struct SourceHandle {
    name: Arc<str>,
    bus: gst::Bus,
    thread: JoinHandle<Result<(), SourceError>>,
    counters: Arc<SourceCounters>,
}

/// Initializes GStreamer once per process.
pub fn init() -> Result<(), String> {
    static INIT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INIT.get_or_init(|| gst::init().map_err(|e| e.to_string()))
        .clone()
}

/// Starts a source. Frames go into `frames`; at most `max_frames` are accepted.
pub fn start(
    config: &SourceConfig,
    frames: Sender<Frame>,
    max_frames: Option<u64>,
) -> Result<SourceHandle, SourceError> {
    let name = config.name.clone();
    let uri = &config.uri;
    let gst_error = |message: String| SourceError::Gstreamer {
        name: name.to_string(),
        message,
    };
    preflight(config)?;
    init().map_err(gst_error)?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let pipeline = gst::parse::launch(&describe(uri, threads))
        .map_err(|e| gst_error(e.to_string()))?
        .downcast::<gst::Pipeline>()
        .map_err(|_| gst_error("description is not a pipeline".to_owned()))?;
    if let Some(src) = pipeline.by_name(pipeline::SOURCE_ELEMENT) {
        match uri {
            SourceUri::File { path } => {
                src.set_property("location", path.to_string_lossy().as_ref())
            }
            SourceUri::Rtsp { url } => src.set_property("location", url.as_str()),
            SourceUri::V4l2 { device, .. } => {
                src.set_property("device", device.to_string_lossy().as_ref());
            }
            SourceUri::Test(_) => {}
        }
    }
    let appsink = pipeline
        .by_name(pipeline::APPSINK)
        .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
        .ok_or_else(|| gst_error("no appsink in pipeline".to_owned()))?;

    let counters = Arc::new(SourceCounters::default());
    appsink.set_callbacks(callbacks(
        name.clone(),
        frames,
        max_frames,
        counters.clone(),
    ));

    let bus = pipeline
        .bus()
        .ok_or_else(|| gst_error("pipeline has no bus".to_owned()))?;
    if pipeline.set_state(gst::State::Playing).is_err() {
        let err = first_error(&bus, &name, uri).unwrap_or_else(|| SourceError::Unavailable {
            name: name.to_string(),
            uri: uri.to_string(),
            reason: "pipeline refused to start".to_owned(),
        });
        let _ = pipeline.set_state(gst::State::Null);
        return Err(err);
    }
    tracing::info!(source = %name, uri = %uri, "source started");

    let thread = {
        let bus = bus.clone();
        let name = name.clone();
        let uri = uri.clone();
        let counters = counters.clone();
        std::thread::Builder::new()
            .name(format!("vidflow-source-{name}"))
            .spawn(move || watch_bus(&pipeline, &appsink, &bus, &name, &uri, &counters))
            .map_err(|e| gst_error(format!("cannot spawn bus thread: {e}")))?
    };
    Ok(SourceHandle {
        name,
        bus,
        thread,
        counters,
    })
}

/// Stops a running source from any thread.
#[derive(Debug, Clone)]
pub struct SourceControl {
    bus: gst::Bus,
}

impl SourceControl {
    /// Asks the source to end its stream; frames already decoded are still delivered.
    pub fn stop(&self) {
        post(&self.bus, STOP_MESSAGE);
    }

    /// Stops the source at once.
    pub fn abort(&self) {
        post(&self.bus, ABORT_MESSAGE);
    }
}

impl SourceHandle {
    pub fn control(&self) -> SourceControl {
        SourceControl {
            bus: self.bus.clone(),
        }
    }

    pub fn counters(&self) -> &Arc<SourceCounters> {
        &self.counters
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Waits for the bus thread; the pipeline is down when this returns.
    pub fn join(self) -> Result<(), SourceError> {
        self.thread.join().unwrap_or_else(|_| {
            Err(SourceError::Gstreamer {
                name: self.name.to_string(),
                message: "source thread panicked".to_owned(),
            })
        })
    }
}

fn post(bus: &gst::Bus, what: &str) {
    // A post fails only when the bus is already flushing: the source has ended anyway.
    let _ = bus.post(gst::message::Application::new(gst::Structure::new_empty(
        what,
    )));
}

/// Checks what can be checked before GStreamer runs, for errors that say what is wrong.
fn preflight(config: &SourceConfig) -> Result<(), SourceError> {
    let unavailable = |reason: String| SourceError::Unavailable {
        name: config.name.to_string(),
        uri: config.uri.to_string(),
        reason,
    };
    match &config.uri {
        SourceUri::File { path } => match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(unavailable("not a regular file".to_owned())),
            Err(e) => Err(unavailable(format!("cannot open: {e}"))),
        },
        SourceUri::V4l2 { device, .. } => match std::fs::metadata(device) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(unavailable(
                "no such camera device (is it plugged in, and is the user in group \"video\"?)"
                    .to_owned(),
            )),
            Err(e) => Err(unavailable(format!("cannot open camera device: {e}"))),
        },
        SourceUri::Rtsp { .. } | SourceUri::Test(_) => Ok(()),
    }
}

fn callbacks(
    name: Arc<str>,
    frames: Sender<Frame>,
    max_frames: Option<u64>,
    counters: Arc<SourceCounters>,
) -> gst_app::AppSinkCallbacks {
    let mut info: Option<(gst::Caps, gst_video::VideoInfo)> = None;
    let mut seq = 0u64;
    gst_app::AppSinkCallbacks::builder()
        .new_sample(move |sink| {
            // Always pull: a sample left in the appsink would make it wait forever at EOS.
            let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
            if max_frames.is_some_and(|max| seq >= max) {
                return Err(gst::FlowError::Eos);
            }
            let caps = sample.caps_owned().ok_or(gst::FlowError::NotNegotiated)?;
            if info.as_ref().is_none_or(|(c, _)| *c != caps) {
                let parsed = gst_video::VideoInfo::from_caps(&caps)
                    .map_err(|_| gst::FlowError::NotNegotiated)?;
                info = Some((caps, parsed));
            }
            let Some((_, video_info)) = info.as_ref() else {
                return Err(gst::FlowError::NotNegotiated);
            };
            let buffer = sample.buffer_owned().ok_or(gst::FlowError::Error)?;
            let frame = match Frame::from_buffer(name.clone(), seq, buffer, video_info) {
                Ok(frame) => frame,
                Err(e) => {
                    tracing::error!(source = %name, error = %e, "cannot wrap decoded buffer");
                    return Err(gst::FlowError::Error);
                }
            };
            seq += 1;
            counters.decoded.fetch_add(1, Ordering::Relaxed);
            if frames.send(frame).is_err() {
                // The consumer is gone (hard stop): this frame will never be processed.
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                return Err(gst::FlowError::Eos);
            }
            if max_frames.is_some_and(|max| seq >= max) {
                post_from(sink, STOP_MESSAGE);
            }
            Ok(gst::FlowSuccess::Ok)
        })
        .build()
}

fn post_from(sink: &gst_app::AppSink, what: &str) {
    let _ = sink.post_message(gst::message::Application::new(gst::Structure::new_empty(
        what,
    )));
}

/// The bus thread: waits for the end of the stream, an error or a stop request.
fn watch_bus(
    pipeline: &gst::Pipeline,
    appsink: &gst_app::AppSink,
    bus: &gst::Bus,
    name: &Arc<str>,
    uri: &SourceUri,
    counters: &SourceCounters,
) -> Result<(), SourceError> {
    use gst::MessageType as T;
    let mut stopping: Option<(Instant, u64)> = None;
    let mut eos_thread = None;
    let result = loop {
        let timeout = stopping.map(|(since, _)| {
            gst::ClockTime::try_from(STOP_GRACE.saturating_sub(since.elapsed()))
                .unwrap_or(gst::ClockTime::ZERO)
        });
        let Some(msg) = bus.timed_pop_filtered(timeout, &[T::Eos, T::Error, T::Application]) else {
            // Deadline passed while stopping; keep waiting only if frames are still moving.
            let decoded = counters.decoded.load(Ordering::Relaxed);
            match stopping {
                Some((_, seen)) if decoded != seen => stopping = Some((Instant::now(), decoded)),
                _ => {
                    tracing::warn!(source = %name, "no end of stream after stop request; stopping hard");
                    break Ok(());
                }
            }
            continue;
        };
        match msg.view() {
            gst::MessageView::Eos(_) => {
                tracing::info!(source = %name, "end of stream");
                break Ok(());
            }
            gst::MessageView::Error(err) => {
                break Err(SourceError::Stream {
                    name: name.to_string(),
                    uri: uri.to_string(),
                    element: err
                        .src()
                        .map_or_else(|| "pipeline".to_owned(), |s| s.name().to_string()),
                    message: uri.scrub(&err.error().to_string()),
                    debug: err.debug().map(|d| uri.scrub(&d)),
                });
            }
            gst::MessageView::Application(app) => match app.structure().map(|s| s.name()) {
                Some(n) if n == STOP_MESSAGE && stopping.is_none() => {
                    tracing::info!(source = %name, "stopping: sending end of stream");
                    stopping = Some((Instant::now(), counters.decoded.load(Ordering::Relaxed)));
                    eos_thread = send_eos(pipeline);
                }
                Some(n) if n == ABORT_MESSAGE => break Ok(()),
                _ => {}
            },
            _ => {}
        }
    };
    let _ = pipeline.set_state(gst::State::Null);
    if let Some(thread) = eos_thread {
        // Returns once the pipeline is down, if it had not already.
        let _ = thread.join();
    }
    // Dropping the callbacks drops the frame sender: the consumer sees the channel close.
    appsink.set_callbacks(gst_app::AppSinkCallbacks::builder().build());
    result
}

/// Sends EOS from a helper thread: sending it can block until the streaming thread gets to it,
/// and the bus thread must stay free to enforce [`STOP_GRACE`].
fn send_eos(pipeline: &gst::Pipeline) -> Option<JoinHandle<()>> {
    let weak = pipeline.downgrade();
    let sent = std::thread::Builder::new()
        .name("vidflow-eos".to_owned())
        .spawn(move || {
            if let Some(pipeline) = weak.upgrade() {
                pipeline.send_event(gst::event::Eos::new());
            }
        });
    match sent {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::warn!(error = %e, "cannot spawn EOS thread; stopping hard");
            let _ = pipeline.set_state(gst::State::Null);
            None
        }
    }
}

/// The first error message on the bus, if there is one already.
fn first_error(bus: &gst::Bus, name: &str, uri: &SourceUri) -> Option<SourceError> {
    let msg =
        bus.timed_pop_filtered(gst::ClockTime::from_seconds(1), &[gst::MessageType::Error])?;
    let gst::MessageView::Error(err) = msg.view() else {
        return None;
    };
    Some(SourceError::Unavailable {
        name: name.to_owned(),
        uri: uri.to_string(),
        reason: uri.scrub(&err.error().to_string()),
    })
}
