//! `clip`: event recording like a security NVR: one short video per event, from `pre_roll_s`
//! before it to `post_roll_s` after its last trigger.
//!
//! Every source's images are encoded all the time (x264, no B-frames, a keyframe every
//! `keyframe_s`) into a ring of encoded frames that always reaches back at least `pre_roll_s`
//! from a keyframe, so a clip can start before its event. A frame whose `when` value is
//! non-empty triggers: if no clip of that source is being written, one is opened and the ring is
//! written into it first; later encoded frames go to it until one is more than `post_roll_s`
//! past the last trigger (a new trigger extends the clip) or the clip reaches `max_clip_s`.
//! Then the file is finished (fragmented MP4, so a crash leaves it playable up to its last
//! fragment) and a line naming it is appended to `clips.jsonl` in the same folder.
//!
//! A source whose images change size or frame rate (a camera back at another size) has its
//! encoder closed (the clip being written finished and indexed) and a new one started at the
//! new size, with an empty ring; an event still within its post-roll goes on in a new clip.
//!
//! Threads: none of its own; GStreamer runs each encoder and writer in its streaming threads,
//! and this sink's thread pushes images, pulls what the encoder made (never waiting for it while
//! frames flow) and waits, bounded by [`FINISH_TIMEOUT`], only when a clip is finished and at
//! close, when each encoder is drained to its end of stream.
//!
//! Memory: per source, the ring holds `pre_roll_s` plus up to one keyframe interval of H.264
//! (at 2 Mbit/s and 5 s, about 1.5 MB), plus the encoder's own frames.

use std::collections::{HashMap, VecDeque};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;
use serde::Deserialize;
use toml::Spanned;

use super::video_file::VideoFile;
use super::video_file::size::SaidOnce;
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, Ref, SinkInput};
use crate::storage::{Class, FilePolicy, Retention, SinkFiles, Writing};
use crate::value::Value;

/// Longest wait for a clip's file to be finished, or for an encoder to give its last frames.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Frame rate assumed when the source does not say.
const DEFAULT_FPS: (i32, i32) = (30, 1);
/// Free space a clip needs to be opened after its disk was full (less, and it fails at once).
const ROOM_TO_OPEN: u64 = 4 << 20;
/// The index of written clips, in the clips' folder.
const INDEX: &str = "clips.jsonl";

pub(super) static KIND: SinkKind = SinkKind {
    name: "clip",
    summary: "one H.264 clip per event, from pre_roll_s before it to post_roll_s after it",
    inputs: &[super::IMAGE_PORT, super::WHEN_PORT],
    params: &[
        ParamDoc {
            name: "dir",
            ty: "path",
            default: "required",
            doc: "folder of the clips (created): SOURCE-TIME.mp4 and an index clips.jsonl",
        },
        ParamDoc {
            name: "pre_roll_s",
            ty: "float",
            default: "5.0",
            doc: "video kept from before the first trigger (at least this, from a keyframe)",
        },
        ParamDoc {
            name: "post_roll_s",
            ty: "float",
            default: "5.0",
            doc: "video kept after the last trigger; a trigger within it extends the clip",
        },
        ParamDoc {
            name: "max_clip_s",
            ty: "float",
            default: "300.0",
            doc: "longest clip; a longer event goes on in a new clip",
        },
        ParamDoc {
            name: "keyframe_s",
            ty: "float",
            default: "1.0",
            doc: "keyframe interval: how close to pre_roll_s a clip can start",
        },
        ParamDoc {
            name: "preset",
            ty: "string",
            default: "\"veryfast\"",
            doc: "x264 speed preset",
        },
        ParamDoc {
            name: "bitrate_kbps",
            ty: "integer",
            default: "2048",
            doc: "target bitrate",
        },
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    dir: PathBuf,
    pre_roll_s: Option<Spanned<f64>>,
    post_roll_s: Option<Spanned<f64>>,
    max_clip_s: Option<Spanned<f64>>,
    keyframe_s: Option<Spanned<f64>>,
    preset: Option<Spanned<String>>,
    bitrate_kbps: Option<Spanned<u32>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

#[derive(Debug, Clone)]
struct Settings {
    dir: PathBuf,
    pre_roll: Duration,
    post_roll: Duration,
    max_clip: Duration,
    keyframe: Duration,
    preset: String,
    bitrate_kbps: u32,
}

/// A duration parameter within `range` seconds, or `default`.
fn seconds(
    name: &str,
    value: Option<Spanned<f64>>,
    default: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Duration, Diagnostic> {
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(default));
    };
    if !range.contains(v.get_ref()) {
        return Err(Diagnostic::at(
            v.span(),
            format!(
                "{name} must be between {} and {}, not {}",
                range.start(),
                range.end(),
                v.get_ref()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(*v.get_ref()))
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let (preset, bitrate_kbps) = super::video_file::encoder_options(c.preset, c.bitrate_kbps)?;
    let settings = Settings {
        dir: c.dir,
        pre_roll: seconds("pre_roll_s", c.pre_roll_s, 5.0, 0.0..=600.0)?,
        post_roll: seconds("post_roll_s", c.post_roll_s, 5.0, 0.0..=600.0)?,
        max_clip: seconds("max_clip_s", c.max_clip_s, 300.0, 1.0..=86_400.0)?,
        keyframe: seconds("keyframe_s", c.keyframe_s, 1.0, 0.1..=60.0)?,
        preset,
        bitrate_kbps,
    };
    // A clip of an event as short as it can be (pre-roll and post-roll) must fit.
    let bytes_per_s = u64::from(settings.bitrate_kbps) * 125;
    let shortest = (settings.pre_roll + settings.post_roll).as_secs().max(1) * bytes_per_s;
    let policy = FilePolicy {
        class: Class::Event,
        retention: Retention::parse(
            c.retain_days,
            c.max_gb,
            Some((shortest, "clip of pre_roll_s + post_roll_s")),
        )?,
        expected_file: shortest * 3 / 2,
    };
    Ok(Box::new(Factory(settings, policy)))
}

#[derive(Debug)]
struct Factory(Settings, FilePolicy);

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let dir = &self.0.dir;
        std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
            path: dir.clone(),
            source,
        })?;
        crate::gst_setup::init().map_err(|message| SinkError::Gstreamer {
            path: dir.clone(),
            message,
        })?;
        let image = inputs
            .iter()
            .find(|i| i.port == "image")
            .map(|i| i.from)
            .ok_or_else(|| SinkError::Other("clip: no image input".to_owned()))?;
        let when = inputs
            .iter()
            .filter(|i| i.port == "when")
            .map(|i| i.from)
            .collect();
        Ok(Box::new(ClipSink {
            files: storage.sink(name, self.1),
            settings: self.0.clone(),
            image,
            when,
            sources: HashMap::new(),
            sizes: SaidOnce::default(),
        }))
    }

    fn images_of(&self, width: u32, height: u32) -> Result<Option<String>, String> {
        super::video_file::size::images_of(width, height)
    }
}

struct ClipSink {
    files: SinkFiles,
    settings: Settings,
    image: Ref,
    when: Vec<Ref>,
    sources: HashMap<Arc<str>, SourceClips>,
    /// Padded or refused image sizes already logged.
    sizes: SaidOnce,
}

/// One encoded frame.
struct Encoded {
    /// On the encoder's timeline (from the source's first frame).
    pts: gst::ClockTime,
    keyframe: bool,
    buffer: gst::Buffer,
}

/// A clip being written.
struct Writer {
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    path: PathBuf,
    /// Encoder time of its first frame (its time 0).
    start: gst::ClockTime,
    /// Encoder time of its last frame written so far.
    end: gst::ClockTime,
    frames: u64,
    first_frame: u64,
    /// When its first frame left the decoder.
    first_captured: std::time::SystemTime,
    /// Keeps the clip from retention while it is written.
    _writing: Option<Writing>,
}

/// The encoder, ring and clip of one source.
struct SourceClips {
    source: Arc<str>,
    files: SinkFiles,
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    appsink: gst_app::AppSink,
    /// The size encoded: the images' own, padded to a size H.264 takes
    /// ([`super::video_file::size`]).
    info: gst_video::VideoInfo,
    /// The images' own size.
    image: (u32, u32),
    frame_duration: gst::ClockTime,
    /// The source's time of its first frame (encoder time 0).
    first: Duration,
    last_pts: Option<gst::ClockTime>,
    ring: VecDeque<Encoded>,
    writer: Option<Writer>,
    /// Encoder time of the last trigger, while it still calls for video.
    trigger: Option<gst::ClockTime>,
    /// Each pushed image's encoder time, frame number and capture time, until it is encoded
    /// (for the clip's name and its line in the index).
    pushed: VecDeque<(gst::ClockTime, u64, std::time::SystemTime)>,
}

fn gst_err(path: &std::path::Path, message: impl Into<String>) -> SinkError {
    SinkError::Gstreamer {
        path: path.to_owned(),
        message: message.into(),
    }
}

impl SourceClips {
    fn start(
        settings: &Settings,
        source: Arc<str>,
        width: i32,
        height: i32,
        fps: (i32, i32),
        first: Duration,
        files: SinkFiles,
    ) -> Result<Self, SinkError> {
        let dir = &settings.dir;
        let err = |m: String| gst_err(dir, m);
        let frames_per_key =
            (settings.keyframe.as_secs_f64() * f64::from(fps.0) / f64::from(fps.1.max(1))).round();
        let desc = format!(
            "appsrc name=src format=time block=false max-bytes=33554432 ! videoconvert ! \
             video/x-raw,format=I420 ! x264enc speed-preset={} bitrate={} tune=zerolatency \
             key-int-max={} ! h264parse ! video/x-h264,stream-format=avc,alignment=au ! \
             appsink name=out sync=false",
            settings.preset,
            settings.bitrate_kbps,
            frames_per_key.max(1.0) as u32
        );
        let pipeline = gst::parse::launch(&desc)
            .map_err(|e| err(e.to_string()))?
            .downcast::<gst::Pipeline>()
            .map_err(|_| err("not a pipeline".to_owned()))?;
        let appsrc = pipeline
            .by_name("src")
            .and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
            .ok_or_else(|| err("no appsrc".to_owned()))?;
        let appsink = pipeline
            .by_name("out")
            .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
            .ok_or_else(|| err("no appsink".to_owned()))?;
        let (w, h) = (
            u32::try_from(width).map_err(|_| err("bad width".to_owned()))?,
            u32::try_from(height).map_err(|_| err("bad height".to_owned()))?,
        );
        let (coded_w, coded_h) = super::video_file::size::coded_size(w, h).map_err(err)?;
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Bgr, coded_w, coded_h)
            .fps(gst::Fraction::new(fps.0, fps.1))
            .build()
            .map_err(|e| err(e.to_string()))?;
        appsrc.set_caps(Some(&info.to_caps().map_err(|e| err(e.to_string()))?));
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| err(format!("cannot start encoder: {e}")))?;
        let frame_duration = gst::ClockTime::SECOND
            .mul_div_floor(fps.1.max(1) as u64, fps.0.max(1) as u64)
            .unwrap_or(gst::ClockTime::from_mseconds(33));
        Ok(Self {
            source,
            files,
            pipeline,
            appsrc,
            appsink,
            info,
            image: (w, h),
            frame_duration,
            first,
            last_pts: None,
            ring: VecDeque::new(),
            writer: None,
            trigger: None,
            pushed: VecDeque::new(),
        })
    }

    /// Encodes one image at the source's time `at`.
    fn push(
        &mut self,
        settings: &Settings,
        result: &FrameResult,
        image: &crate::value::Image,
        at: Duration,
    ) -> Result<gst::ClockTime, SinkError> {
        let mut buffer = VideoFile::buffer_for(image, &self.info)?;
        let pts =
            gst::ClockTime::try_from(at.saturating_sub(self.first)).unwrap_or(gst::ClockTime::ZERO);
        let pts = match self.last_pts {
            Some(last) if pts <= last => last + self.frame_duration,
            _ => pts,
        };
        self.last_pts = Some(pts);
        if let Some(b) = buffer.get_mut() {
            b.set_pts(pts);
            b.set_duration(self.frame_duration);
        }
        let frame = result.frame();
        self.pushed.push_back((pts, frame.seq, frame.captured));
        self.appsrc
            .push_buffer(buffer)
            .map_err(|e| gst_err(&settings.dir, format!("encoder refused a frame: {e:?}")))?;
        Ok(pts)
    }

    /// Takes what the encoder has made, waiting up to `wait` for each piece (zero: only what is
    /// ready), and files each encoded frame into the clip or the ring. Returns false at the
    /// encoder's end of stream.
    fn pull(&mut self, settings: &Settings, wait: gst::ClockTime) -> Result<bool, SinkError> {
        loop {
            let Some(sample) = self.appsink.try_pull_sample(wait) else {
                return Ok(!self.appsink.is_eos());
            };
            let Some(buffer) = sample.buffer_owned() else {
                continue;
            };
            // x264enc shifts its output into a segment starting at 1000 h (room for decoding
            // times before presentation times): back to the timeline of the images pushed.
            let pts = buffer.pts().unwrap_or(gst::ClockTime::ZERO);
            let pts = sample
                .segment()
                .and_then(|s| s.downcast_ref::<gst::ClockTime>())
                .and_then(|s| s.to_running_time(pts))
                .unwrap_or(pts);
            let keyframe = !buffer.flags().contains(gst::BufferFlags::DELTA_UNIT);
            let encoded = Encoded {
                pts,
                keyframe,
                buffer,
            };
            self.file(settings, encoded, sample.caps())?;
        }
    }

    /// Sends one encoded frame to the clip being written, opening or finishing clips as the
    /// trigger asks, or keeps it in the ring.
    fn file(
        &mut self,
        settings: &Settings,
        encoded: Encoded,
        caps: Option<&gst::CapsRef>,
    ) -> Result<(), SinkError> {
        let post_roll = gst::ClockTime::try_from(settings.post_roll).unwrap_or_default();
        let max_clip = gst::ClockTime::try_from(settings.max_clip).unwrap_or_default();
        if let Some(writer) = &self.writer {
            let past_post_roll = self.trigger.is_none_or(|t| encoded.pts > t + post_roll);
            let too_long = encoded.pts.saturating_sub(writer.start) >= max_clip && encoded.keyframe;
            if past_post_roll || too_long {
                self.finish(settings)?;
                if past_post_roll {
                    self.trigger = None;
                }
            }
        }
        if self.writer.is_none() && self.trigger.is_some_and(|t| encoded.pts > t + post_roll) {
            // A trigger that found no keyframe to start from before its post-roll ran out.
            self.trigger = None;
        }
        // The clip's first keyframe is known once the encoder has reached the pre-roll's start
        // (it may lag behind the trigger by more than the pre-roll: a loaded machine).
        let pre_roll = gst::ClockTime::try_from(settings.pre_roll).unwrap_or_default();
        let reached = self
            .trigger
            .is_some_and(|t| encoded.pts >= t.saturating_sub(pre_roll));
        self.ring.push_back(encoded);
        if self.writer.is_none() && reached {
            self.open(settings, caps)?;
        }
        if self.writer.is_some() {
            while let Some(e) = self.ring.pop_front() {
                self.write(settings, e)?;
            }
        } else {
            self.prune(settings);
        }
        Ok(())
    }

    /// Drops from the ring what is older than the pre-roll needs: it keeps the latest keyframe
    /// at least `pre_roll` before its newest frame, and everything after it.
    fn prune(&mut self, settings: &Settings) {
        let Some(newest) = self.ring.back().map(|e| e.pts) else {
            return;
        };
        let pre_roll = gst::ClockTime::try_from(settings.pre_roll).unwrap_or_default();
        let horizon = newest.saturating_sub(pre_roll);
        let keep_from = self
            .ring
            .iter()
            .rposition(|e| e.keyframe && e.pts <= horizon)
            .or_else(|| self.ring.iter().position(|e| e.keyframe));
        match keep_from {
            Some(at) => drop(self.ring.drain(..at)),
            // No keyframe at all: nothing here can start a clip.
            None => self.ring.clear(),
        }
    }

    /// Opens a clip file whose first frame is the latest keyframe at least `pre_roll` before the
    /// trigger (called once the encoder has reached that far), or the ring's first keyframe
    /// when it does not reach back that far.
    fn open(&mut self, settings: &Settings, caps: Option<&gst::CapsRef>) -> Result<(), SinkError> {
        let pre_roll = gst::ClockTime::try_from(settings.pre_roll).unwrap_or_default();
        let horizon = self.trigger.unwrap_or_default().saturating_sub(pre_roll);
        if let Some(at) = self
            .ring
            .iter()
            .rposition(|e| e.keyframe && e.pts <= horizon)
        {
            self.ring.drain(..at);
        }
        while self.ring.front().is_some_and(|e| !e.keyframe) {
            self.ring.pop_front();
        }
        let (Some(first), Some(caps)) = (self.ring.front(), caps) else {
            // Not yet a keyframe to start from: the next one will open the clip.
            return Ok(());
        };
        let start = first.pts;
        let (first_frame, first_captured) = self
            .pushed
            .iter()
            .find(|(pts, _, _)| *pts >= start)
            .map_or((0, std::time::SystemTime::now()), |(_, seq, at)| {
                (*seq, *at)
            });
        let path = new_clip_path(settings, &self.source, first_captured);
        // A full disk: the storage makes room by its policies, or the clip waits in the ring.
        let room = |dir: &std::path::Path| {
            crate::storage::space(dir).is_ok_and(|s| s.free >= ROOM_TO_OPEN)
        };
        if !room(&settings.dir) && (self.files.disk_full(&path) == 0 || !room(&settings.dir)) {
            return Ok(());
        }
        let writing = match self.files.create(&path, &self.source) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "clip not indexed; retention will not delete it");
                None
            }
        };
        let err = |m: String| gst_err(&path, m);
        let desc = "appsrc name=src format=time ! h264parse ! \
                    mp4mux fragment-duration=1000 ! filesink name=file buffer-mode=unbuffered";
        let pipeline = gst::parse::launch(desc)
            .map_err(|e| err(e.to_string()))?
            .downcast::<gst::Pipeline>()
            .map_err(|_| err("not a pipeline".to_owned()))?;
        let appsrc = pipeline
            .by_name("src")
            .and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
            .ok_or_else(|| err("no appsrc".to_owned()))?;
        appsrc.set_caps(Some(&caps.to_owned()));
        let file = pipeline
            .by_name("file")
            .ok_or_else(|| err("no filesink".to_owned()))?;
        file.set_property("location", path.to_string_lossy().as_ref());
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| err(format!("cannot start the clip writer: {e}")))?;
        tracing::info!(source = %self.source, path = %path.display(), "clip started");
        self.writer = Some(Writer {
            pipeline,
            appsrc,
            path,
            start,
            end: start,
            frames: 0,
            first_frame,
            first_captured,
            _writing: writing,
        });
        Ok(())
    }

    fn write(&mut self, settings: &Settings, encoded: Encoded) -> Result<(), SinkError> {
        let Some(writer) = self.writer.as_mut() else {
            return Ok(());
        };
        let mut buffer = encoded.buffer;
        let pts = encoded.pts.saturating_sub(writer.start);
        {
            let b = buffer.make_mut();
            b.set_pts(pts);
            // No B-frames (zerolatency): decoding order is presentation order.
            b.set_dts(pts);
        }
        writer.end = encoded.pts;
        writer.frames += 1;
        while self
            .pushed
            .front()
            .is_some_and(|(p, _, _)| *p < encoded.pts)
        {
            self.pushed.pop_front();
        }
        writer
            .appsrc
            .push_buffer(buffer)
            .map_err(|e| gst_err(&settings.dir, format!("clip writer refused a frame: {e:?}")))?;
        Ok(())
    }

    /// Finishes the clip being written (if any) and lists it in the index.
    fn finish(&mut self, settings: &Settings) -> Result<(), SinkError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let _ = writer.appsrc.end_of_stream();
        let finished = wait_for_eos(&writer.pipeline, &writer.path);
        let _ = writer.pipeline.set_state(gst::State::Null);
        finished?;
        let duration = (writer.end - writer.start) + self.frame_duration;
        let line = serde_json::json!({
            "source": &*self.source,
            "path": writer.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "first_frame": writer.first_frame,
            "frames": writer.frames,
            "time": humantime::format_rfc3339_millis(writer.first_captured).to_string(),
            "pts_s": (self.first + Duration::from(writer.start)).as_secs_f64(),
            "duration_s": duration.seconds_f64(),
        });
        append_index(settings, &line)?;
        tracing::info!(source = %self.source, path = %writer.path.display(), frames = writer.frames, "clip written");
        Ok(())
    }

    /// Ends the encoder: what it still holds is filed, then the open clip is finished.
    fn close(mut self, settings: &Settings) -> Result<(), SinkError> {
        let _ = self.appsrc.end_of_stream();
        let wait = gst::ClockTime::try_from(FINISH_TIMEOUT).unwrap_or_default();
        let drained = self.pull(settings, wait);
        let finished = self.finish(settings);
        let _ = self.pipeline.set_state(gst::State::Null);
        drained?;
        finished
    }
}

fn wait_for_eos(pipeline: &gst::Pipeline, path: &std::path::Path) -> Result<(), SinkError> {
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

/// `DIR/SOURCE-TIME.mp4` for a clip whose first frame was decoded at `at`, with `-1`, `-2`...
/// when that name is taken.
fn new_clip_path(settings: &Settings, source: &str, at: std::time::SystemTime) -> PathBuf {
    let time = super::compact_time(at);
    let base = format!("{source}-{time}");
    let mut path = settings.dir.join(format!("{base}.mp4"));
    let mut n = 0;
    while path.exists() {
        n += 1;
        path = settings.dir.join(format!("{base}-{n}.mp4"));
    }
    path
}

fn append_index(settings: &Settings, line: &serde_json::Value) -> Result<(), SinkError> {
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

impl ClipSink {
    /// Closes the encoder of `source` (its clip finished and indexed) when its images are now
    /// `(width, height, fps)` and it encodes another size or frame rate, so that a new one
    /// starts at `at`. An event still within its post-roll goes on into a clip at the new size:
    /// the trigger returned is the new encoder's (its start: the post-roll counts again from
    /// the change). A failure to finish the old clip is logged.
    fn close_if_changed(
        &mut self,
        source: &Arc<str>,
        (width, height, fps): (i32, i32, (i32, i32)),
        at: Duration,
    ) -> Option<gst::ClockTime> {
        let clips = self.sources.get(source)?;
        let size = |v: i32| u32::try_from(v).unwrap_or(0);
        let (from, to) = super::video_file::changed(
            (clips.image, clips.info.fps()),
            size(width),
            size(height),
            fps,
        )?;
        let last_trigger = clips.trigger.map(|t| clips.first + Duration::from(t));
        tracing::info!(
            source = %source,
            "clip: images of \"{source}\" went from {from} to {to}; its encoder starts again \
             (a clip being written is finished, and goes on in a new file)"
        );
        if let Some(clips) = self.sources.remove(source)
            && let Err(e) = clips.close(&self.settings)
        {
            tracing::error!(source = %source, error = %e, "clip: the clip before the change was not finished");
        }
        last_trigger
            .filter(|&t| at.saturating_sub(t) <= self.settings.post_roll)
            .map(|_| gst::ClockTime::ZERO)
    }
}

impl Sink for ClipSink {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let Some(Value::Image(image)) = result.value(self.image) else {
            return Ok(false);
        };
        let frame = result.frame();
        let at = super::source_time(result);
        let triggered = super::any_non_empty(result, self.when.iter().copied());
        let (width, height, _) = image.shape();
        let fps = frame.fps.unwrap_or(DEFAULT_FPS);
        let carried = self.close_if_changed(&frame.source, (width, height, fps), at);
        let settings = &self.settings;
        if !self.sources.contains_key(&frame.source) {
            let size = |v: i32| u32::try_from(v).unwrap_or(0);
            self.sizes
                .say("clip", &frame.source, size(width), size(height));
            let files = self.files.clone();
            let mut c = SourceClips::start(
                settings,
                frame.source.clone(),
                width,
                height,
                fps,
                at,
                files,
            )?;
            c.trigger = carried;
            self.sources.insert(frame.source.clone(), c);
        }
        let Some(clips) = self.sources.get_mut(&frame.source) else {
            return Ok(false);
        };
        let pts = clips.push(settings, result, &image, at)?;
        if triggered {
            clips.trigger = Some(pts);
        }
        clips.pull(settings, gst::ClockTime::ZERO)?;
        Ok(true)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        let mut first_error = None;
        for (_, clips) in self.sources {
            if let Err(e) = clips.close(&self.settings) {
                tracing::warn!(error = %e, "clip sink: closing a source's clips failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
