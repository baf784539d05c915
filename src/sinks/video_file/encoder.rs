//! One encoder of a `video_file` sink: `appsrc ! videoconvert ! I420 ! x264enc ! h264parse !
//! splitmuxsink` writing segments of `segment_seconds`, each cut at a keyframe the encoder is
//! asked for (`send-keyframe-requests`), so every segment starts with one and plays alone.
//! The muxer writes as it goes, so that a segment cut short by SIGKILL or power loss plays up
//! to its last piece: `mp4mux` fragmented every [`MP4_FRAGMENT_MS`] (moov first, then
//! moof+mdat fragments), or `matroskamux` (clusters). Both checked with GStreamer 1.22.
//!
//! Threads: GStreamer's streaming threads encode and write; the sink's own thread pushes.
//! They share one [`Shared`] state under a mutex with a condvar: the appsrc's `need-data` /
//! `enough-data` callbacks set `full`, and a bus sync handler records the first error and the
//! end of stream as they happen (so an error mid-run is seen at the next push, not at close).
//! `appsrc` never blocks (`block=false`): a push waits on the condvar while the queue is full,
//! at most [`PUSH_TIMEOUT`], and an encoder that takes no frame for that long, or posted an
//! error, puts the encoder in the failed state: every later push fails at once (the runner
//! counts those frames as dropped) and nothing waits on it again.
//! Memory: the appsrc queue holds at most [`QUEUE_BYTES`] of images (plus the one pushed when
//! it filled), x264 its lookahead, the muxer one fragment.
//!
//! Durability: each segment the muxer closed is handed, as it closes, to the encoder's
//! `vidflow-sync` thread (`storage::Syncer`), which syncs it with its folder at once: neither
//! GStreamer's thread (which would hold the muxer while the disk writes) nor the sink's thread
//! (a slow disk would make gaps) waits for the disk, and a segment finished just before the
//! frames stop is synced then, not at close. Close syncs the last segment and waits for every
//! sync, at most [`CLOSE_TIMEOUT`]: a power cut takes no finished segment, only what the kernel
//! had not yet written of the one being written (it writes back within about 30 s).
//!
//! Stop protocol: [`Encoder::close`] sends EOS and waits on the condvar for the end of stream
//! (the last segment is finalized then) or an error, at most [`CLOSE_TIMEOUT`]; then the
//! pipeline goes to `Null`. A failed encoder skips the EOS.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use crate::gst_setup::from_c;
use crate::sinks::SinkError;
use crate::sinks::common::naming::{self, Counter};
use crate::storage::{SinkFiles, SyncQueue, Syncer, Writing};

/// Longest wait for the muxer to finish the last segment after the last frame.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a push waits for room in the encoder's queue: far longer than any frame takes to
/// encode on a loaded machine, so reaching it means the encoder (or its disk) is stuck.
pub(super) const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Images queued in front of the encoder (about 12 frames of 720p BGR).
const QUEUE_BYTES: u64 = 32 << 20;
/// Length of an MP4 fragment: what a SIGKILL may cost at most of the segment being written.
pub(super) const MP4_FRAGMENT_MS: u32 = 1000;

/// What an encoder is asked to write.
/// (Each segment is indexed in the sink's [`SinkFiles`] as it is named, and marked finished when
/// `splitmuxsink` says it closed it, or when the encoder ends.)
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// File name template: `{source}` and `{start}` (UTC, `20261201T061500Z`) placeholders.
    pub template: String,
    pub source: String,
    pub mp4: bool,
    pub preset: String,
    pub bitrate_kbps: u32,
    pub segment: Duration,
    pub keyframe_seconds: u32,
}

/// State shared with GStreamer's threads (see the module header).
#[derive(Debug, Default)]
struct State {
    full: bool,
    eos: bool,
    error: Option<String>,
    /// The error was a write that found the disk full.
    no_space: bool,
    /// Segments named and not yet closed, kept from deletion while written.
    writing: Vec<Writing>,
    /// Segments named that could not be indexed (the disk was full even for that).
    unindexed: Vec<PathBuf>,
    /// The segment named last.
    last: Option<PathBuf>,
    /// Segments named and not yet closed, with the frames the muxer took for each so far (the
    /// last is the one being written).
    muxing: Vec<(PathBuf, u64)>,
    /// Frames in segments the muxer closed: in files that play to their end.
    finished: u64,
    /// Segments the muxer closed.
    closed: u64,
    /// Segments named (the one being written included).
    named: u64,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Where each segment the muxer closed goes to be synced (see the module header).
    sync: Option<SyncQueue>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

/// Names segment files: the template with `{source}` and `{start}` filled in, and a counter
/// when the name is taken (or when the template has no `{start}`): never an existing file.
#[derive(Debug)]
struct Namer {
    template: String,
    source: String,
    /// The next counter to try for a name without `{start}`.
    next: u32,
}

/// Names the next segment and indexes it as being written.
fn name_segment(namer: &Mutex<Namer>, files: &SinkFiles, shared: &Shared) -> PathBuf {
    let (name, source) = {
        let mut namer = namer.lock().unwrap_or_else(PoisonError::into_inner);
        (namer.next_name(), namer.source.clone())
    };
    {
        let mut state = shared.lock();
        state.last = Some(name.clone());
        state.muxing.push((name.clone(), 0));
        state.named += 1;
    }
    match files.create(&name, &source) {
        Ok(writing) => shared.lock().writing.push(writing),
        // The file is written all the same: it is only never deleted by retention.
        Err(e) => {
            tracing::warn!(path = %name.display(), error = %e, "segment not indexed; retention will not delete it");
            shared.lock().unindexed.push(name.clone());
        }
    }
    tracing::info!(path = %name.display(), "new video segment");
    name
}

/// Counts each buffer the muxer inside `split` takes into the segment being written (the last
/// named: `splitmuxsink` names the next segment before it gives the muxer its first buffer).
fn count_muxed_frames(split: &gst::Element, shared: &Arc<Shared>) -> Result<(), String> {
    let muxer = split
        .property::<Option<gst::Element>>("muxer")
        .ok_or("splitmuxsink has no muxer")?;
    let probe = |pad: &gst::Pad, shared: Arc<Shared>| {
        pad.add_probe(gst::PadProbeType::BUFFER, move |_, _| {
            from_c("video_file's muxer probe", gst::PadProbeReturn::Ok, || {
                if let Some((_, frames)) = shared.lock().muxing.last_mut() {
                    *frames += 1;
                }
                gst::PadProbeReturn::Ok
            })
        });
    };
    let pads = muxer.sink_pads();
    if pads.is_empty() {
        let shared = shared.clone();
        muxer.connect_pad_added(move |_, pad| {
            from_c("video_file's muxer pad-added", (), || {
                if pad.direction() == gst::PadDirection::Sink {
                    probe(pad, shared.clone());
                }
            })
        });
    }
    for pad in &pads {
        probe(pad, shared.clone());
    }
    Ok(())
}

/// What the encoder's bus says, on the thread that posts it: its first error (and whether the
/// disk was full), its end, and each segment the muxer finished (its frames then count as
/// written, and a segment the disk had no room for at all is removed).
fn on_encoder_message(shared: &Shared, msg: &gst::Message) {
    match msg.view() {
        gst::MessageView::Error(e) => shared.update(|s| {
            if s.error.is_none() {
                s.no_space = e.error().matches(gst::ResourceError::NoSpaceLeft);
                s.error = Some(format!(
                    "{}{}",
                    e.error(),
                    e.debug().map(|d| format!(" ({d})")).unwrap_or_default()
                ));
            }
        }),
        gst::MessageView::Eos(_) => shared.update(|s| s.eos = true),
        gst::MessageView::Element(e) => {
            let closed = e
                .structure()
                .filter(|s| s.name() == "splitmuxsink-fragment-closed")
                .and_then(|s| s.get::<String>("location").ok());
            if let Some(location) = closed {
                // Dropped outside the lock: finishing it takes the storage's.
                let done: Vec<Writing> = {
                    let mut state = shared.lock();
                    let at = Path::new(&location);
                    if let Some(sync) = &shared.sync {
                        sync.sync(at);
                    }
                    if let Some(i) = state.muxing.iter().position(|(p, _)| p == at) {
                        let (_, frames) = state.muxing.remove(i);
                        state.finished += frames;
                        state.closed += 1;
                    }
                    let (done, open) = std::mem::take(&mut state.writing)
                        .into_iter()
                        .partition(|w| w.path() == Path::new(&location));
                    state.writing = open;
                    done
                };
                // A segment the disk had no room for at all is removed.
                for w in done {
                    w.discard_if_empty();
                }
            }
        }
        _ => {}
    }
}

impl Namer {
    fn next_name(&mut self) -> PathBuf {
        let start = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(['-', ':'], "");
        let base = PathBuf::from(
            self.template
                .replace("{source}", &self.source)
                .replace("{start}", &start),
        );
        let from = if self.template.contains("{start}") {
            0
        } else {
            self.next
        };
        // `a.mp4`, `a.1.mp4`, `a.2.mp4`, ...
        let (name, n) = naming::first_free(&base, from, Counter::Dot);
        self.next = n + 1;
        name
    }
}

/// The muxing half of an encoder: `appsrc ! MIDDLE ! splitmuxsink`, naming and indexing its
/// segments and counting what they hold; `MIDDLE` encodes (`video_file`) or only parses
/// (`record`: the camera's own packets, see `sinks/record`).
pub(in crate::sinks) struct Muxing {
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    shared: Arc<Shared>,
    /// Buffers (frames) the pipeline took.
    pub(in crate::sinks) pushed: u64,
    /// Set once the pipeline failed: the error, reported at close too.
    failed: Option<String>,
    path: PathBuf,
    source: String,
    /// The sink's count of frames it took that are in no finished file (see
    /// [`Muxing::settle`]).
    lost: Arc<AtomicU64>,
    /// Whether this pipeline's frames were settled into `lost` already.
    settled: bool,
    /// Syncs each segment as the muxer closes it (see the module header).
    syncer: Syncer,
}

/// Where and how a [`Muxing`] writes.
#[derive(Debug, Clone)]
pub(in crate::sinks) struct Segments {
    /// File name template: `{source}` and `{start}` placeholders.
    pub template: String,
    pub source: String,
    pub mp4: bool,
    pub segment: Duration,
    /// Ask upstream for a keyframe at each cut (an encoder can make one; a camera's stream
    /// is cut at its next keyframe instead).
    pub keyframe_requests: bool,
}

pub(super) struct Encoder {
    muxing: Muxing,
    pub info: gst_video::VideoInfo,
    pub frame_duration: gst::ClockTime,
    /// The images' own size (`info` is the size encoded: see [`super::size`]).
    image: (u32, u32),
    pub first_pts: Option<Duration>,
    pub last_pts: Option<gst::ClockTime>,
}

impl Encoder {
    pub(super) fn start(
        settings: &Settings,
        width: u32,
        height: u32,
        fps: (i32, i32),
        files: &SinkFiles,
        lost: Arc<AtomicU64>,
    ) -> Result<Self, SinkError> {
        let path = PathBuf::from(settings.template.replace("{source}", &settings.source));
        let err = |message: String| SinkError::Gstreamer {
            path: path.clone(),
            message,
        };
        let (coded_width, coded_height) = super::size::coded_size(width, height).map_err(err)?;
        let keyframes = (u64::from(settings.keyframe_seconds) * fps.0.max(1) as u64
            / fps.1.max(1) as u64)
            .max(1);
        // No B-frames: with them, fragmented MP4 lost the last two frames before each cut.
        let middle = format!(
            "videoconvert ! video/x-raw,format=I420 ! x264enc speed-preset={} bitrate={} \
             key-int-max={keyframes} bframes=0 ! h264parse",
            settings.preset, settings.bitrate_kbps,
        );
        let info =
            gst_video::VideoInfo::builder(gst_video::VideoFormat::Bgr, coded_width, coded_height)
                .fps(gst::Fraction::new(fps.0, fps.1))
                .build()
                .map_err(|e| err(e.to_string()))?;
        let caps = info.to_caps().map_err(|e| err(e.to_string()))?;
        let segments = Segments {
            template: settings.template.clone(),
            source: settings.source.clone(),
            mp4: settings.mp4,
            segment: settings.segment,
            keyframe_requests: true,
        };
        let muxing = Muxing::launch(&segments, &middle, &caps, files, lost)?;
        let frame_duration = gst::ClockTime::SECOND
            .mul_div_floor(fps.1.max(1) as u64, fps.0.max(1) as u64)
            .unwrap_or(gst::ClockTime::from_mseconds(33));
        Ok(Self {
            muxing,
            info,
            frame_duration,
            image: (width, height),
            first_pts: None,
            last_pts: None,
        })
    }

    /// Frames the encoder took.
    pub(super) fn pushed(&self) -> u64 {
        self.muxing.pushed
    }

    /// Whether the encoder failed because its disk was full.
    pub(super) fn out_of_space(&self) -> bool {
        self.muxing.out_of_space()
    }

    /// The segment being written, if any.
    pub(super) fn segment(&self) -> Option<PathBuf> {
        self.muxing.segment()
    }

    /// Pushes one frame, waiting for room at most [`PUSH_TIMEOUT`].
    pub(super) fn push(&mut self, buffer: gst::Buffer) -> Result<(), SinkError> {
        self.muxing.push(buffer)
    }

    /// Finalizes the last segment (see the module header).
    pub(super) fn close(self) -> Result<(), SinkError> {
        self.muxing.close()
    }

    /// The size of the images this encoder takes and their frame rate.
    pub(super) fn format(&self) -> ((u32, u32), gst::Fraction) {
        (self.image, self.info.fps())
    }
}

impl Muxing {
    /// Starts `appsrc ! middle ! splitmuxsink` taking buffers of `caps`.
    pub(in crate::sinks) fn launch(
        segments: &Segments,
        middle: &str,
        caps: &gst::Caps,
        files: &SinkFiles,
        lost: Arc<AtomicU64>,
    ) -> Result<Self, SinkError> {
        let path = PathBuf::from(segments.template.replace("{source}", &segments.source));
        let err = |message: String| SinkError::Gstreamer {
            path: path.clone(),
            message,
        };
        crate::sinks::create_parent(&path)?;
        // The muxer and file sink are given here, not set afterwards: splitmuxsink makes its
        // (default) muxer when the parser links to it, during the parse. Each piece the muxer
        // finishes goes to the disk at once: filesink's default 64 KiB buffer would hold
        // seconds of a small video back from a crash.
        let muxer = if segments.mp4 {
            format!("mp4mux fragment-duration={MP4_FRAGMENT_MS}")
        } else {
            "matroskamux".to_owned()
        };
        let desc = format!(
            "appsrc name=src format=time block=false max-bytes={QUEUE_BYTES} ! {middle} ! \
             splitmuxsink name=split send-keyframe-requests={} max-size-time={} \
             muxer=\"{muxer}\" sink=\"filesink buffer-mode=unbuffered\"",
            segments.keyframe_requests,
            segments.segment.as_nanos()
        );
        let pipeline = gst::parse::launch(&desc)
            .map_err(|e| err(e.to_string()))?
            .downcast::<gst::Pipeline>()
            .map_err(|_| err("not a pipeline".to_owned()))?;
        let split = pipeline
            .by_name("split")
            .ok_or_else(|| err("no splitmuxsink".to_owned()))?;
        let namer = Mutex::new(Namer {
            template: segments.template.clone(),
            source: segments.source.clone(),
            next: 0,
        });
        let syncer = Syncer::start("segment")
            .map_err(|e| err(format!("cannot start its sync thread: {e}")))?;
        let shared = Arc::new(Shared {
            sync: Some(syncer.queue()),
            ..Shared::default()
        });
        let (on_name, files) = (shared.clone(), files.clone());
        split.connect("format-location", false, move |_| {
            from_c("video_file's format-location", None, || {
                let name = name_segment(&namer, &files, &on_name);
                Some(name.to_string_lossy().into_owned().to_value())
            })
        });
        let appsrc = pipeline
            .by_name("src")
            .and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
            .ok_or_else(|| err("no appsrc".to_owned()))?;
        count_muxed_frames(&split, &shared).map_err(err)?;
        appsrc.set_caps(Some(caps));

        let (on_need, on_enough) = (shared.clone(), shared.clone());
        appsrc.set_callbacks(
            gst_app::AppSrcCallbacks::builder()
                .need_data(move |_, _| on_need.update(|s| s.full = false))
                .enough_data(move |_| on_enough.update(|s| s.full = true))
                .build(),
        );
        let bus = pipeline.bus().ok_or_else(|| err("no bus".to_owned()))?;
        let on_bus = shared.clone();
        bus.set_sync_handler(move |_, msg| {
            from_c("video_file's bus handler", gst::BusSyncReply::Drop, || {
                on_encoder_message(&on_bus, msg);
                gst::BusSyncReply::Drop
            })
        });
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| err(format!("cannot start encoder: {e}")))?;
        Ok(Self {
            pipeline,
            appsrc,
            shared,
            pushed: 0,
            failed: None,
            path,
            source: segments.source.clone(),
            lost,
            settled: false,
            syncer,
        })
    }

    /// Segments named so far (the one being written included).
    pub(in crate::sinks) fn segments(&self) -> u64 {
        self.shared.lock().named
    }

    fn error(&self, message: String) -> SinkError {
        SinkError::Gstreamer {
            path: self.path.clone(),
            message,
        }
    }

    /// Puts the encoder in the failed state for good (see the module header).
    fn fail(&mut self, message: String) -> SinkError {
        let _ = self.pipeline.set_state(gst::State::Null);
        self.settle(false);
        self.failed = Some(message.clone());
        self.release();
        self.error(message)
    }

    /// Whether the pipeline failed because its disk was full.
    pub(in crate::sinks) fn out_of_space(&self) -> bool {
        self.shared.lock().no_space
    }

    /// The segment being written, if any.
    pub(in crate::sinks) fn segment(&self) -> Option<PathBuf> {
        self.shared
            .lock()
            .writing
            .last()
            .map(|w| w.path().to_owned())
    }

    /// Once the pipeline is stopped: syncs the last segment named (finished, or cut short by a
    /// failure: it plays up to its last fragment) and waits for every sync, at most
    /// [`CLOSE_TIMEOUT`]. A sync that fails is said, not fatal: the file is written.
    fn sync_finished(&self) {
        if let Some(last) = self.shared.lock().last.clone() {
            self.syncer.queue().sync(&last);
        }
        if !self.syncer.flush(CLOSE_TIMEOUT) {
            tracing::warn!(path = %self.path.display(), "the disk did not sync the segments within {} s: a power cut may take them", CLOSE_TIMEOUT.as_secs());
        }
    }

    /// Marks every segment still open finished (the pipeline is stopped); one the disk had no
    /// room for at all is removed.
    fn release(&self) {
        self.sync_finished();
        let (writing, unindexed) = {
            let mut state = self.shared.lock();
            (
                std::mem::take(&mut state.writing),
                std::mem::take(&mut state.unindexed),
            )
        };
        for w in writing {
            w.discard_if_empty();
        }
        // Named by this encoder (so never someone else's file) and left empty.
        for path in unindexed {
            if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Pushes one buffer, waiting for room at most [`PUSH_TIMEOUT`].
    pub(in crate::sinks) fn push(&mut self, buffer: gst::Buffer) -> Result<(), SinkError> {
        if let Some(message) = &self.failed {
            return Err(self.error(format!("failed earlier: {message}")));
        }
        let deadline = Instant::now() + PUSH_TIMEOUT;
        let waited = {
            let mut state = self.shared.lock();
            loop {
                if let Some(e) = &state.error {
                    break Err(e.clone());
                }
                if !state.full {
                    break Ok(());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(format!(
                        "the encoder took no frame for {} s",
                        PUSH_TIMEOUT.as_secs()
                    ));
                }
                state = self
                    .shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        if let Err(message) = waited {
            return Err(self.fail(message));
        }
        if let Err(e) = self.appsrc.push_buffer(buffer) {
            return Err(self.fail(format!("encoder refused a frame: {e:?}")));
        }
        self.pushed += 1;
        Ok(())
    }

    /// Finalizes the last segment (see the module header).
    pub(in crate::sinks) fn close(mut self) -> Result<(), SinkError> {
        if let Some(message) = &self.failed {
            self.release();
            return Err(self.error(message.clone()));
        }
        let _ = self.appsrc.end_of_stream();
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        let outcome = {
            let mut state = self.shared.lock();
            loop {
                if let Some(e) = &state.error {
                    break Err(e.clone());
                }
                if state.eos {
                    break Ok(());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(format!(
                        "the encoder did not finish within {} s; the last segment plays up to \
                         its last fragment",
                        CLOSE_TIMEOUT.as_secs()
                    ));
                }
                state = self
                    .shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let _ = self.pipeline.set_state(gst::State::Null);
        self.settle(outcome.is_ok());
        self.release();
        outcome.map_err(|m| self.error(m))
    }

    /// Once the pipeline has stopped: counts into `lost` the frames this encoder took that are
    /// in no finished segment. A segment is finished when the muxer closed it, or, when the
    /// encoder reached its end of stream (`finalized`), every segment still open. Frames
    /// still queued in the encoder, and those of a segment that was not finalized (an encoder
    /// error, a full disk: it may play up to its last fragment, but is not counted as
    /// written), are lost.
    fn settle(&mut self, finalized: bool) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let in_files = {
            let mut state = self.shared.lock();
            let open: u64 = state.muxing.drain(..).map(|(_, n)| n).sum();
            state.finished + if finalized { open } else { 0 }
        };
        let lost = self.pushed.saturating_sub(in_files);
        if lost > 0 {
            self.lost.fetch_add(lost, Ordering::Relaxed);
            tracing::warn!(
                source = %self.source,
                path = %self.path.display(),
                "video_file: {lost} of the {} frame(s) the encoder took are in no finished \
                 segment; counted as dropped",
                self.pushed
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Class, FilePolicy, Retention, Storage, StorageConfig, SystemClock};

    /// A segment the muxer closes is synced then, by the sync thread: with no frame pushed
    /// after it (the camera stalled), not at the next push or at close.
    #[test]
    fn a_closed_segment_is_synced_without_another_frame() {
        gst::init().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
        let policy = FilePolicy {
            class: Class::Continuous,
            retention: Retention::default(),
            expected_file: 0,
        };
        let settings = Settings {
            template: dir
                .path()
                .join("{source}.mkv")
                .to_string_lossy()
                .into_owned(),
            source: "door".to_owned(),
            mp4: false,
            preset: "ultrafast".to_owned(),
            bitrate_kbps: 256,
            segment: Duration::from_secs(1),
            keyframe_seconds: 1,
        };
        let lost = Arc::new(AtomicU64::new(0));
        let files = storage.sink("video", policy);
        let mut encoder = Encoder::start(&settings, 64, 64, (10, 1), &files, lost).unwrap();
        // 2.5 s of frames: the first segment is closed at the cut near 1 s, or 2 s.
        for i in 0..25u64 {
            let mut buffer = gst::Buffer::with_size(64 * 64 * 3).unwrap();
            let b = buffer.get_mut().unwrap();
            b.set_pts(gst::ClockTime::from_mseconds(i * 100));
            b.set_duration(gst::ClockTime::from_mseconds(100));
            encoder.push(buffer).unwrap();
        }
        // No frame after those: a closed segment is synced all the same (a generous bound for
        // a loaded machine: this is about whether, not how fast).
        let deadline = Instant::now() + Duration::from_secs(60);
        while encoder.muxing.syncer.synced() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            encoder.muxing.syncer.synced() >= 1,
            "no segment synced before the next frame ({} closed)",
            encoder.muxing.shared.lock().closed
        );
        encoder.close().unwrap();
    }

    #[test]
    fn a_name_that_exists_gets_the_next_free_counter() {
        let dir = tempfile::tempdir().unwrap();
        let template = dir
            .path()
            .join("{source}.mkv")
            .to_string_lossy()
            .into_owned();
        std::fs::write(dir.path().join("door.mkv"), "old").unwrap();
        std::fs::write(dir.path().join("door.2.mkv"), "old").unwrap();
        let mut namer = Namer {
            template,
            source: "door".to_owned(),
            next: 0,
        };
        let first = namer.next_name();
        assert_eq!(first, dir.path().join("door.1.mkv"));
        std::fs::write(&first, "new").unwrap();
        assert_eq!(namer.next_name(), dir.path().join("door.3.mkv"));
    }

    #[test]
    fn a_start_placeholder_is_the_utc_time_in_basic_format() {
        let dir = tempfile::tempdir().unwrap();
        let template = dir
            .path()
            .join("cam-{start}.mp4")
            .to_string_lossy()
            .into_owned();
        let mut namer = Namer {
            template,
            source: "door".to_owned(),
            next: 0,
        };
        let name = namer.next_name();
        let name = name.file_name().unwrap().to_string_lossy().into_owned();
        // cam-20261201T061500Z.mp4
        assert_eq!(name.len(), "cam-20261201T061500Z.mp4".len(), "{name}");
        assert!(
            name.starts_with("cam-2") && name.ends_with("Z.mp4"),
            "{name}"
        );
        assert_eq!(&name[12..13], "T", "{name}");
    }
}
