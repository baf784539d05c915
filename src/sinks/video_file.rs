//! `video_file`: H.264 in MP4 or Matroska, through GStreamer.
//!
//! The encoder pipeline is built at the first image (its size fixes the caps):
//! `appsrc ! videoconvert ! I420 ! x264enc ! h264parse ! mp4mux|matroskamux ! filesink`.
//! `appsrc` blocks when its queue is full, so this sink's thread waits on the encoder rather
//! than piling frames up. Closing sends EOS and waits for it at the bus (the muxer writes its
//! index then), up to [`CLOSE_TIMEOUT`]. Memory: the appsrc queue holds at most 32 MiB of
//! images, x264 at most its lookahead plus its threads' frames (I420 at the video's size), and
//! the MP4 muxer's index grows by a few bytes per frame until the file is finalized.

use std::path::PathBuf;
use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;
use opencv::core::{Mat, MatTraitConst, MatTraitConstManual};
use opencv::imgproc;
use serde::Deserialize;
use toml::Spanned;

use super::{Sink, SinkError, SinkFactory, SinkKind, SinkPort};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::value::{Image, Value, ValueType};

/// Longest wait for the muxer to finish the file after the last frame.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Frame rate written when the source does not say (a live camera without caps, say).
const DEFAULT_FPS: (i32, i32) = (30, 1);

pub(super) static KIND: SinkKind = SinkKind {
    name: "video_file",
    summary: "encode an image per frame to H.264 in .mp4 or .mkv (finalized on close)",
    inputs: &[SinkPort {
        name: "image",
        ty: Some(ValueType::Image),
        list: false,
    }],
    params: &[
        ParamDoc {
            name: "path",
            ty: "path ending .mp4 or .mkv",
            default: "required",
            doc: "file to write (created, with its folder)",
        },
        ParamDoc {
            name: "preset",
            ty: "string",
            default: "\"veryfast\"",
            doc: "x264 speed preset (ultrafast .. veryslow)",
        },
        ParamDoc {
            name: "bitrate_kbps",
            ty: "integer",
            default: "2048",
            doc: "target bitrate",
        },
    ],
    build,
};

const PRESETS: &[&str] = &[
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: Spanned<PathBuf>,
    preset: Option<Spanned<String>>,
    bitrate_kbps: Option<Spanned<u32>>,
}

#[derive(Debug)]
struct Factory {
    path: PathBuf,
    muxer: &'static str,
    preset: String,
    bitrate_kbps: u32,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let ext = c.path.get_ref().extension().and_then(|e| e.to_str());
    let muxer = match ext.map(str::to_ascii_lowercase).as_deref() {
        Some("mp4") => "mp4mux",
        Some("mkv") => "matroskamux",
        _ => {
            return Err(Diagnostic::at(
                c.path.span(),
                format!(
                    "path \"{}\" must end in .mp4 or .mkv",
                    c.path.get_ref().display()
                ),
            ));
        }
    };
    let (preset, bitrate_kbps) = encoder_options(c.preset, c.bitrate_kbps)?;
    Ok(Box::new(Factory {
        path: c.path.into_inner(),
        muxer,
        preset,
        bitrate_kbps,
    }))
}

/// The x264 `preset` and `bitrate_kbps` parameters, checked, or their defaults.
pub(super) fn encoder_options(
    preset: Option<Spanned<String>>,
    bitrate_kbps: Option<Spanned<u32>>,
) -> Result<(String, u32), Diagnostic> {
    let preset = match preset {
        Some(p) if !PRESETS.contains(&p.get_ref().as_str()) => {
            return Err(Diagnostic::at(
                p.span(),
                format!(
                    "unknown preset \"{}\"; known: {}",
                    p.get_ref(),
                    PRESETS.join(", ")
                ),
            ));
        }
        Some(p) => p.into_inner(),
        None => "veryfast".to_owned(),
    };
    let bitrate_kbps = match bitrate_kbps {
        Some(b) if !(16..=200_000).contains(b.get_ref()) => {
            return Err(Diagnostic::at(
                b.span(),
                "bitrate_kbps must be between 16 and 200000",
            ));
        }
        Some(b) => b.into_inner(),
        None => 2048,
    };
    Ok((preset, bitrate_kbps))
}

impl SinkFactory for Factory {
    fn open(&self, _name: &str, inputs: &[SinkInput]) -> Result<Box<dyn Sink>, SinkError> {
        super::create_parent(&self.path)?;
        // Fail now, not at the first frame, if the file cannot be created.
        std::fs::File::create(&self.path).map_err(|source| SinkError::Io {
            path: self.path.clone(),
            source,
        })?;
        crate::gst_setup::init().map_err(|message| SinkError::Gstreamer {
            path: self.path.clone(),
            message,
        })?;
        let image = inputs
            .iter()
            .find(|i| i.port == "image")
            .map(|i| i.from)
            .ok_or_else(|| SinkError::Other("video_file: no image input".to_owned()))?;
        Ok(Box::new(VideoFile {
            path: self.path.clone(),
            muxer: self.muxer,
            preset: self.preset.clone(),
            bitrate_kbps: self.bitrate_kbps,
            image,
            encoder: None,
            size_warned: false,
        }))
    }
}

pub(super) struct VideoFile {
    path: PathBuf,
    muxer: &'static str,
    preset: String,
    bitrate_kbps: u32,
    image: crate::spec::Ref,
    encoder: Option<Encoder>,
    size_warned: bool,
}

/// An image's BGR bytes, for a GStreamer buffer that borrows them. Only built for images whose
/// BGR Mat exists and is continuous (checked in `buffer_for`).
struct ImageBytes(Image);

impl AsRef<[u8]> for ImageBytes {
    fn as_ref(&self) -> &[u8] {
        self.0
            .mat()
            .ok()
            .and_then(|m| m.data_bytes().ok())
            .unwrap_or_default()
    }
}

struct Encoder {
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    info: gst_video::VideoInfo,
    frame_duration: gst::ClockTime,
    first_pts: Option<Duration>,
    last_pts: Option<gst::ClockTime>,
    written: u64,
}

impl VideoFile {
    fn gst_err(&self, message: impl Into<String>) -> SinkError {
        SinkError::Gstreamer {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    fn start(&self, width: i32, height: i32, fps: (i32, i32)) -> Result<Encoder, SinkError> {
        let desc = format!(
            "appsrc name=src format=time block=true max-bytes=33554432 ! videoconvert ! \
             video/x-raw,format=I420 ! x264enc speed-preset={} bitrate={} key-int-max=250 ! \
             h264parse ! {} ! filesink name=out",
            self.preset, self.bitrate_kbps, self.muxer
        );
        let pipeline = gst::parse::launch(&desc)
            .map_err(|e| self.gst_err(e.to_string()))?
            .downcast::<gst::Pipeline>()
            .map_err(|_| self.gst_err("not a pipeline"))?;
        let out = pipeline
            .by_name("out")
            .ok_or_else(|| self.gst_err("no filesink"))?;
        out.set_property("location", self.path.to_string_lossy().as_ref());
        let appsrc = pipeline
            .by_name("src")
            .and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
            .ok_or_else(|| self.gst_err("no appsrc"))?;
        let (w, h) = (
            u32::try_from(width).map_err(|_| self.gst_err("bad width"))?,
            u32::try_from(height).map_err(|_| self.gst_err("bad height"))?,
        );
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Bgr, w, h)
            .fps(gst::Fraction::new(fps.0, fps.1))
            .build()
            .map_err(|e| self.gst_err(e.to_string()))?;
        let caps = info.to_caps().map_err(|e| self.gst_err(e.to_string()))?;
        appsrc.set_caps(Some(&caps));
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| self.gst_err(format!("cannot start encoder: {e}")))?;
        let frame_duration = gst::ClockTime::SECOND
            .mul_div_floor(fps.1 as u64, fps.0.max(1) as u64)
            .unwrap_or(gst::ClockTime::from_mseconds(33));
        Ok(Encoder {
            pipeline,
            appsrc,
            info,
            frame_duration,
            first_pts: None,
            last_pts: None,
            written: 0,
        })
    }

    /// The image as a buffer of BGR rows at the stride GStreamer expects for `info`: the
    /// image's own memory when it is laid out that way (no copy), its rows copied otherwise.
    pub(super) fn buffer_for(
        image: &Image,
        info: &gst_video::VideoInfo,
    ) -> Result<gst::Buffer, SinkError> {
        let other = |e: opencv::Error| SinkError::Other(format!("opencv: {e}"));
        let mat = image
            .mat()
            .map_err(|e| SinkError::Other(format!("image: {e}")))?;
        let own_memory = mat.channels() == 3;
        let bgr;
        let mat = if !own_memory {
            let mut converted = Mat::default();
            imgproc::cvt_color_def(mat, &mut converted, imgproc::COLOR_GRAY2BGR).map_err(other)?;
            bgr = converted;
            &bgr
        } else {
            mat
        };
        let stride = info.stride()[0] as usize;
        let row = info.width() as usize * 3;
        if own_memory && mat.is_continuous() && row == stride {
            // The buffer keeps the image (and so its pixels) alive until the encoder is done.
            return Ok(gst::Buffer::from_slice(ImageBytes(image.clone())));
        }
        let mut out = vec![0u8; info.size()];
        for y in 0..mat.rows() {
            let src = mat.ptr(y).map_err(other)?;
            // SAFETY: row `y` of an 8-bit 3-channel Mat holds `cols * 3 == row` bytes at `src`,
            // and the Mat outlives this loop.
            let src = unsafe { std::slice::from_raw_parts(src, row) };
            let at = y as usize * stride;
            out[at..at + row].copy_from_slice(src);
        }
        Ok(gst::Buffer::from_slice(out))
    }
}

impl Sink for VideoFile {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let Some(Value::Image(image)) = result.value(self.image) else {
            return Ok(false);
        };
        let (width, height, _) = image.shape();
        let frame = result.frame();
        if self.encoder.is_none() {
            let fps = frame.fps.unwrap_or(DEFAULT_FPS);
            self.encoder = Some(self.start(width, height, fps)?);
        }
        let Some(enc) = self.encoder.as_mut() else {
            return Ok(false);
        };
        if width != enc.info.width() as i32 || height != enc.info.height() as i32 {
            if !self.size_warned {
                tracing::warn!(path = %self.path.display(), "image size changed; frames of the new size are not written");
                self.size_warned = true;
            }
            return Ok(false);
        }
        let mut buffer = Self::buffer_for(&image, &enc.info)?;
        // Timestamps follow the source's, relative to the first frame written; without them,
        // the nominal frame rate. Either way they only ever increase.
        let pts = match (frame.pts, enc.first_pts) {
            (Some(p), Some(first)) => {
                gst::ClockTime::try_from(p.saturating_sub(first)).unwrap_or(gst::ClockTime::ZERO)
            }
            (Some(p), None) => {
                enc.first_pts = Some(p);
                gst::ClockTime::ZERO
            }
            (None, _) => enc.frame_duration * enc.written,
        };
        let pts = match enc.last_pts {
            Some(last) if pts <= last => last + gst::ClockTime::from_nseconds(1),
            _ => pts,
        };
        enc.last_pts = Some(pts);
        if let Some(b) = buffer.get_mut() {
            b.set_pts(pts);
            b.set_duration(enc.frame_duration);
        }
        enc.appsrc
            .push_buffer(buffer)
            .map_err(|e| SinkError::Gstreamer {
                path: self.path.clone(),
                message: format!("encoder refused a frame: {e:?}"),
            })?;
        enc.written += 1;
        Ok(true)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        let Some(enc) = self.encoder.as_ref() else {
            tracing::warn!(path = %self.path.display(), "no image was produced; the video file is empty");
            return Ok(());
        };
        let _ = enc.appsrc.end_of_stream();
        let bus = enc
            .pipeline
            .bus()
            .ok_or_else(|| self.gst_err("pipeline has no bus"))?;
        let msg = bus.timed_pop_filtered(
            gst::ClockTime::try_from(CLOSE_TIMEOUT).ok(),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        );
        let _ = enc.pipeline.set_state(gst::State::Null);
        match msg.as_ref().map(|m| m.view()) {
            Some(gst::MessageView::Eos(_)) => Ok(()),
            Some(gst::MessageView::Error(e)) => Err(self.gst_err(format!(
                "{}{}",
                e.error(),
                e.debug().map(|d| format!(" ({d})")).unwrap_or_default()
            ))),
            _ => Err(self.gst_err(format!(
                "encoder did not finish within {}s; the file may be unplayable",
                CLOSE_TIMEOUT.as_secs()
            ))),
        }
    }
}
