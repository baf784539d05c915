//! How one connection of a source ended, in words a user can act on: bus errors classified
//! (retry or not), a stall named by what it waited for, frames refused for their size, a file
//! without video.

use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;

use super::pipeline::DECODE;
use super::{Shared, SourceError};

/// How one connection ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// The stream ended by itself.
    Eos,
    /// A stop or abort request ended it.
    Stopped,
    /// A live stream delivered nothing for `stall_timeout`, while it waited for this.
    Stalled(Waiting),
    /// An error a retry may fix (network, server restart).
    Failed(SourceError),
    /// An error no retry fixes (wrong password, missing file).
    Fatal(SourceError),
}

/// What a live connection that delivered nothing was waiting for, from rtspsrc's progress
/// messages: a stall before the first frame is rarely the camera's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Waiting {
    /// Frames: the stream was set up (or this is not RTSP).
    Frames,
    /// The TCP connection to the server.
    Connection,
    /// The server's answer to a request (rtspsrc's step, as it names it).
    Answer(String),
}

impl Waiting {
    /// Takes in a progress message of the connection.
    pub(super) fn follow(&mut self, progress: &gst::message::Progress) {
        let (kind, code, text) = progress.get();
        *self = match (kind, code) {
            (gst::ProgressType::Start | gst::ProgressType::Continue, "connect") => Self::Connection,
            (gst::ProgressType::Start | gst::ProgressType::Continue, "open" | "request") => {
                Self::Answer(text.to_owned())
            }
            (gst::ProgressType::Complete, "open" | "request") => Self::Frames,
            _ => return,
        };
    }

    /// Why the connection was given up after `stall` without a frame.
    pub(super) fn reason(&self, stall: Duration) -> String {
        let ms = stall.as_millis();
        match self {
            Self::Frames => format!("no frame for {ms} ms"),
            Self::Connection => format!("no connection to the server within {ms} ms"),
            Self::Answer(step) => {
                format!("no answer from the server within {ms} ms (it was at \"{step}\")")
            }
        }
    }
}

/// The error of frames over `max_frame_pixels` (a [`TOO_BIG`] message's size).
pub(super) fn too_big(shared: &Shared, size: Option<&gst::StructureRef>) -> SourceError {
    let get = |field: &str| size.and_then(|s| s.get::<u32>(field).ok()).unwrap_or(0);
    let (width, height) = (get("width"), get("height"));
    let pixels = u64::from(width) * u64::from(height);
    shared.unavailable(format!(
        "its frames are {width}x{height} ({:.1} megapixels), over max_frame_pixels ({}); \
         refused before decoding (raise [sources.{}] max_frame_pixels to take them)",
        pixels as f64 / 1e6,
        shared.options.max_frame_pixels,
        shared.name
    ))
}

/// What the decoder found instead, when none of its streams is video: an error on the way
/// (a demuxer's `not-linked`) then only says that nothing took its data.
fn no_video(pipeline: &gst::Pipeline) -> Option<String> {
    let decode = pipeline.by_name(DECODE)?;
    let pads = decode.src_pads();
    if pads.is_empty() || pads.iter().any(|p| p.is_linked()) {
        return None;
    }
    let kinds: Vec<String> = pads
        .iter()
        .filter_map(|p| p.current_caps())
        .filter_map(|c| c.structure(0).map(|s| s.name().to_string()))
        .collect();
    Some(format!(
        "no video stream in it (it has {})",
        if kinds.is_empty() {
            "streams of unknown kind".to_owned()
        } else {
            kinds.join(", ")
        }
    ))
}

/// Turns a bus error into how the connection ended.
pub(super) fn classify(shared: &Shared, msg: &gst::Message, pipeline: &gst::Pipeline) -> Ended {
    let gst::MessageView::Error(err) = msg.view() else {
        return Ended::Failed(shared.unavailable("unexpected message"));
    };
    if let Some(reason) = no_video(pipeline) {
        // No retry brings a video stream.
        return Ended::Fatal(shared.unavailable(reason));
    }
    let scrub = |s: &str| {
        let s = shared.uri.scrub(s);
        match &shared.options.credentials {
            Some(c) if !c.password.expose().is_empty() => s.replace(c.password.expose(), "***"),
            _ => s,
        }
    };
    let error = SourceError::Stream {
        name: shared.name.to_string(),
        uri: shared.uri.to_string(),
        element: err
            .src()
            .map_or_else(|| "pipeline".to_owned(), |s| s.name().to_string()),
        message: scrub(&err.error().to_string()),
        debug: err.debug().map(|d| scrub(&d)),
    };
    let e = err.error();
    if e.matches(gst::ResourceError::NotAuthorized) {
        Ended::Fatal(shared.unavailable(format!(
            "authentication failed (check user and password): {}",
            scrub(&e.to_string())
        )))
    } else if !shared.uri.is_live() {
        // A file that cannot be decoded will not decode better next time.
        Ended::Fatal(error)
    } else {
        Ended::Failed(error)
    }
}
