//! One clip file being written, in either mode: `appsrc ! PARSER ! mp4mux ! filesink`,
//! fragmented every second so a crash leaves it playable up to its last fragment, synced with
//! its folder once finished (a power cut cannot take it), named so it never overwrites, and
//! indexed in the storage (its retention never deletes it while written).
//!
//! Threads: GStreamer writes in its streaming thread; the caller (the sink's thread, or a
//! packet clip's source thread) pushes, and waits, bounded by [`FINISH_TIMEOUT`], only in
//! [`ClipFile::finish`].

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::Settings;
use crate::sinks::SinkError;
use crate::sinks::common::naming::{self, Counter};
use crate::storage::{SinkFiles, Writing};

/// Longest wait for a clip's file to be finished, or for an encoder to give its last frames.
pub(super) const FINISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Free space a clip needs to be opened after its disk was full (less, and it fails at once).
const ROOM_TO_OPEN: u64 = 4 << 20;
/// The index of written clips, in the clips' folder.
const INDEX: &str = "clips.jsonl";

/// A clip file being written.
pub(super) struct ClipFile {
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    pub(super) path: PathBuf,
    /// Keeps the clip from retention while it is written.
    _writing: Option<Writing>,
}

pub(super) fn gst_err(path: &Path, message: impl Into<String>) -> SinkError {
    SinkError::Gstreamer {
        path: path.to_owned(),
        message: message.into(),
    }
}

impl ClipFile {
    /// Opens a new clip of `source` whose first frame came at `at`, taking buffers of `caps`
    /// through `parser`. `Ok(None)`: the disk is full even after the storage made room by its
    /// policies (the caller tries again later).
    pub(super) fn open(
        settings: &Settings,
        files: &SinkFiles,
        source: &str,
        at: SystemTime,
        caps: &gst::Caps,
        parser: &str,
    ) -> Result<Option<Self>, SinkError> {
        let path = new_clip_path(settings, source, at);
        let room = |dir: &Path| crate::storage::space(dir).is_ok_and(|s| s.free >= ROOM_TO_OPEN);
        if !room(&settings.dir) && (files.disk_full(&path) == 0 || !room(&settings.dir)) {
            return Ok(None);
        }
        let writing = match files.create(&path, source) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "clip not indexed; retention will not delete it");
                None
            }
        };
        let err = |m: String| gst_err(&path, m);
        let desc = format!(
            "appsrc name=src format=time ! {parser} ! \
             mp4mux fragment-duration=1000 ! filesink name=file buffer-mode=unbuffered"
        );
        let (pipeline, appsrc) = launch(&desc, &path)?;
        appsrc.set_caps(Some(caps));
        let file = pipeline
            .by_name("file")
            .ok_or_else(|| err("no filesink".to_owned()))?;
        file.set_property("location", path.to_string_lossy().as_ref());
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| err(format!("cannot start the clip writer: {e}")))?;
        tracing::info!(source = %source, path = %path.display(), "clip started");
        Ok(Some(Self {
            pipeline,
            appsrc,
            path,
            _writing: writing,
        }))
    }

    /// Says the clip was made for frame `seq` of its source (a trigger written into it): it
    /// shows the whole picture, each event of the frame.
    pub(super) fn made_for(&self, seq: u64) {
        if let Some(writing) = &self._writing {
            writing.made_for(seq, crate::storage::Shows::Frame);
        }
    }

    pub(super) fn push(&self, buffer: gst::Buffer) -> Result<(), SinkError> {
        self.appsrc
            .push_buffer(buffer)
            .map(|_| ())
            .map_err(|e| gst_err(&self.path, format!("clip writer refused a frame: {e:?}")))
    }

    /// Ends the file, waits for its last fragment to be written, and syncs it with its folder
    /// (a power cut then cannot take it; a sync that fails is said, the clip is written).
    pub(super) fn finish(self) -> Result<PathBuf, SinkError> {
        let _ = self.appsrc.end_of_stream();
        let finished = wait_for_eos(&self.pipeline, &self.path);
        let _ = self.pipeline.set_state(gst::State::Null);
        if let Err(e) = crate::storage::sync_with_folder(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "clip not synced to the disk: a power cut may take it");
        }
        finished.map(|()| self.path)
    }
}

/// Launches `desc`, a pipeline fed by an `appsrc` named `src`; errors name `path`.
pub(super) fn launch(
    desc: &str,
    path: &Path,
) -> Result<(gst::Pipeline, gst_app::AppSrc), SinkError> {
    let err = |m: String| gst_err(path, m);
    let pipeline = gst::parse::launch(desc)
        .map_err(|e| err(e.to_string()))?
        .downcast::<gst::Pipeline>()
        .map_err(|_| err("not a pipeline".to_owned()))?;
    let appsrc = pipeline
        .by_name("src")
        .and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
        .ok_or_else(|| err("no appsrc".to_owned()))?;
    Ok((pipeline, appsrc))
}

fn wait_for_eos(pipeline: &gst::Pipeline, path: &Path) -> Result<(), SinkError> {
    let bus = pipeline
        .bus()
        .ok_or_else(|| gst_err(path, "pipeline has no bus"))?;
    let msg = bus.timed_pop_filtered(
        gst::ClockTime::try_from(FINISH_TIMEOUT).ok(),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    match msg.as_ref().map(|m| m.view()) {
        Some(gst::MessageView::Eos(_)) => Ok(()),
        Some(gst::MessageView::Error(e)) => Err(gst_err(path, e.error().to_string())),
        _ => Err(gst_err(
            path,
            format!(
                "not finished within {}s; it plays up to its last fragment",
                FINISH_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// `DIR/SOURCE-TIME.mp4` for a clip whose first frame came at `at`, with `-1`, `-2`... when
/// that name is taken.
fn new_clip_path(settings: &Settings, source: &str, at: SystemTime) -> PathBuf {
    let time = crate::sinks::compact_time(at);
    let base = settings.dir.join(format!("{source}-{time}.mp4"));
    naming::first_free(&base, 0, Counter::Dash).0
}

/// Appends one finished clip's line to the index.
pub(super) fn append_index(settings: &Settings, line: &serde_json::Value) -> Result<(), SinkError> {
    let path = settings.dir.join(INDEX);
    let mut text = line.to_string();
    text.push('\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| SinkError::Io { path, source })
}
