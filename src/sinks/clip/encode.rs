//! `clip` in its default mode (`mode = "encode"`): the images given are encoded all the time
//! (x264, no B-frames, a keyframe every `keyframe_s`) into a ring of encoded frames that always
//! reaches back at least `pre_roll_s` from a keyframe, so a clip can start before its event. A
//! frame whose `when` value is non-empty triggers: if no clip of that source is being written,
//! one is opened and the ring is written into it first; later encoded frames go to it until one
//! is more than `post_roll_s` past the last trigger (a new trigger extends the clip) or the clip
//! reaches `max_clip_s`. Then the file is finished and indexed (`file.rs`).
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
use std::sync::Arc;
use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use super::Settings;
use super::file::{ClipFile, FINISH_TIMEOUT, append_index, gst_err};
use crate::outcome::FrameResult;
use crate::sinks::common::when::When;
use crate::sinks::video_file::VideoFile;
use crate::sinks::video_file::size::SaidOnce;
use crate::sinks::{Sink, SinkError};
use crate::spec::Ref;
use crate::storage::SinkFiles;
use crate::value::Value;

/// Frame rate assumed when the source does not say.
const DEFAULT_FPS: (i32, i32) = (30, 1);

pub(super) struct ClipSink {
    files: SinkFiles,
    settings: Settings,
    image: Ref,
    when: When,
    sources: HashMap<Arc<str>, SourceClips>,
    /// Padded or refused image sizes already logged.
    sizes: SaidOnce,
}

impl ClipSink {
    pub(super) fn new(files: SinkFiles, settings: Settings, image: Ref, when: When) -> Self {
        Self {
            files,
            settings,
            image,
            when,
            sources: HashMap::new(),
            sizes: SaidOnce::default(),
        }
    }
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
    file: ClipFile,
    /// Encoder time of its first frame (its time 0).
    start: gst::ClockTime,
    /// Encoder time of its last frame written so far.
    end: gst::ClockTime,
    frames: u64,
    first_frame: u64,
    /// When its first frame left the decoder.
    first_captured: std::time::SystemTime,
}

/// The encoder, ring and clip of one source.
struct SourceClips {
    source: Arc<str>,
    files: SinkFiles,
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    appsink: gst_app::AppSink,
    /// The size encoded: the images' own, padded to a size H.264 takes
    /// ([`crate::sinks::video_file::size`]).
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
    /// Each trigger's encoder time and frame number, until its encoded frame is written to a
    /// clip (which is then said to be made for it) or can no longer be.
    triggers: VecDeque<(gst::ClockTime, u64)>,
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
        let (pipeline, appsrc) = super::file::launch(&desc, dir)?;
        let appsink = pipeline
            .by_name("out")
            .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
            .ok_or_else(|| err("no appsink".to_owned()))?;
        let (w, h) = (
            u32::try_from(width).map_err(|_| err("bad width".to_owned()))?,
            u32::try_from(height).map_err(|_| err("bad height".to_owned()))?,
        );
        let (coded_w, coded_h) = crate::sinks::video_file::size::coded_size(w, h).map_err(err)?;
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
            triggers: VecDeque::new(),
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
                self.write(e)?;
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
        // A trigger before what the ring keeps can be in no clip now.
        let oldest = self.ring.front().map(|e| e.pts);
        self.triggers
            .retain(|(at, _)| oldest.map_or(*at > newest, |o| *at >= o));
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
        let caps = caps.to_owned();
        let opened = ClipFile::open(
            settings,
            &self.files,
            &self.source,
            first_captured,
            &caps,
            "h264parse",
        )?;
        // A full disk: the clip waits in the ring.
        let Some(file) = opened else {
            return Ok(());
        };
        self.writer = Some(Writer {
            file,
            start,
            end: start,
            frames: 0,
            first_frame,
            first_captured,
        });
        Ok(())
    }

    fn write(&mut self, encoded: Encoded) -> Result<(), SinkError> {
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
        while let Some(&(at, seq)) = self.triggers.front()
            && at <= encoded.pts
        {
            writer.file.made_for(seq);
            self.triggers.pop_front();
        }
        while self
            .pushed
            .front()
            .is_some_and(|(p, _, _)| *p < encoded.pts)
        {
            self.pushed.pop_front();
        }
        writer.file.push(buffer)
    }

    /// Finishes the clip being written (if any) and lists it in the index.
    fn finish(&mut self, settings: &Settings) -> Result<(), SinkError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let path = writer.file.finish()?;
        let duration = (writer.end - writer.start) + self.frame_duration;
        let line = serde_json::json!({
            "source": &*self.source,
            "path": path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "first_frame": writer.first_frame,
            "frames": writer.frames,
            "time": humantime::format_rfc3339_millis(writer.first_captured).to_string(),
            "pts_s": (self.first + Duration::from(writer.start)).as_secs_f64(),
            "duration_s": duration.seconds_f64(),
        });
        append_index(settings, &line)?;
        tracing::info!(source = %self.source, path = %path.display(), frames = writer.frames, "clip written");
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
        let (from, to) = crate::sinks::video_file::changed(
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
        let at = crate::sinks::source_time(result);
        let triggered = self.when.triggered(result);
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
            clips.triggers.push_back((pts, frame.seq));
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
