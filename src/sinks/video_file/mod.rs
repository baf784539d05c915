//! `video_file`: H.264 in MP4 or Matroska segments, through GStreamer, one encoder per source.
//!
//! An encoder is built at the first image of its source (its size fixes the caps); see
//! [`encoder`] for its pipeline, its threads, how errors are seen while it writes, and its stop
//! protocol. When a source's images change size or frame rate (a camera back at another size),
//! its encoder is closed, on this thread, finalizing its segment, and a new one is built for
//! the image that changed: its first segment takes the next free name and starts with that
//! image as a keyframe. This sink runs on its runner's thread; encoders are closed one after
//! another at close (each bounded by [`encoder::CLOSE_TIMEOUT`], and the whole by the stop
//! deadline).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use gstreamer as gst;
use gstreamer_video as gst_video;
use opencv::core::{Mat, MatTraitConst, MatTraitConstManual};
use opencv::imgproc;
use serde::Deserialize;
use toml::Spanned;

use super::{Sink, SinkError, SinkFactory, SinkKind, SinkPort};
use crate::frame::Format;
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::storage::{Class, FilePolicy, Retention, SinkFiles};
use crate::value::{Image, Value, ValueType};

pub(super) mod encoder;
pub(super) mod size;

use encoder::{Encoder, Settings};

/// Frame rate written when the source does not say (a live camera without caps, say).
const DEFAULT_FPS: (i32, i32) = (30, 1);

pub(super) static KIND: SinkKind = SinkKind {
    name: "video_file",
    summary: "encode an image per frame to H.264 in .mp4 or .mkv segments (each plays alone)",
    inputs: &[SinkPort {
        name: "image",
        ty: Some(ValueType::Image),
        list: false,
        optional_with: None,
    }],
    params: &[
        SEGMENT_PATH_DOC,
        ParamDoc {
            name: "segment_seconds",
            ty: "integer",
            default: "60",
            doc: "length of a segment; each starts with a keyframe",
        },
        ParamDoc {
            name: "keyframe_seconds",
            ty: "integer",
            default: "2",
            doc: "longest time between keyframes inside a segment",
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
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

/// `path` of a sink writing segments (`video_file`, `record`).
pub(super) const SEGMENT_PATH_DOC: ParamDoc = ParamDoc {
    name: "path",
    ty: "path ending .mp4 or .mkv",
    default: "required",
    doc: "segment files (created with their folder, never overwritten: a taken name gets .1, \
          .2, ...); {source} gives each source its own files (required when the sink takes \
          several sources), {start} the segment's UTC start time",
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
    path: Spanned<String>,
    segment_seconds: Option<Spanned<u32>>,
    keyframe_seconds: Option<Spanned<u32>>,
    preset: Option<Spanned<String>>,
    bitrate_kbps: Option<Spanned<u32>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

/// The longest `segment_seconds` and `keyframe_seconds`: a day.
const MAX_SECONDS: u32 = 86_400;

#[derive(Debug)]
struct Factory {
    settings: Settings,
    policy: FilePolicy,
    /// Reported by validation when the sink takes several sources and the path has no
    /// `{source}`.
    mixes_sources: Option<Diagnostic>,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let (mp4, mixes_sources) = segment_path(&c.path)?;
    let segment_seconds = seconds(c.segment_seconds, "segment_seconds", 60)?;
    let keyframe_seconds = seconds(c.keyframe_seconds, "keyframe_seconds", 2)?;
    let (preset, bitrate_kbps) = encoder_options(c.preset, c.bitrate_kbps)?;
    let segment_bytes = u64::from(bitrate_kbps) * 125 * u64::from(segment_seconds);
    let retention = Retention::parse(
        c.retain_days,
        c.max_gb,
        Some((segment_bytes, "segment at bitrate_kbps")),
    )?;
    Ok(Box::new(Factory {
        settings: Settings {
            template: c.path.into_inner(),
            source: String::new(),
            mp4,
            preset,
            bitrate_kbps,
            segment: Duration::from_secs(segment_seconds.into()),
            keyframe_seconds,
        },
        policy: FilePolicy {
            class: Class::Continuous,
            retention,
            // x264's rate control overshoots over a segment's few seconds, and a segment is
            // cut at a keyframe: a segment may be half as large again as its nominal size.
            expected_file: segment_bytes * 3 / 2,
        },
        mixes_sources,
    }))
}

/// The `path` of a sink writing segments: whether it is MP4 (else Matroska), and the problem
/// to report if the sink takes several sources and the path has no `{source}`.
pub(super) fn segment_path(
    path: &Spanned<String>,
) -> Result<(bool, Option<Diagnostic>), Diagnostic> {
    let ext = std::path::Path::new(path.get_ref())
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let mp4 = match ext.as_deref() {
        Some("mp4") => true,
        Some("mkv") => false,
        _ => {
            return Err(Diagnostic::at(
                path.span(),
                format!("path \"{}\" must end in .mp4 or .mkv", path.get_ref()),
            ));
        }
    };
    let mixes_sources = (!path.get_ref().contains("{source}")).then(|| {
        Diagnostic::at(
            path.span(),
            format!(
                "path \"{}\" has no {{source}} but the sink takes several sources: add \
                 {{source}} to the path, or say which one with sources = [...]",
                path.get_ref()
            ),
        )
    });
    Ok((mp4, mixes_sources))
}

/// A number of seconds between 1 and [`MAX_SECONDS`], or `default`.
pub(super) fn seconds(v: Option<Spanned<u32>>, key: &str, default: u32) -> Result<u32, Diagnostic> {
    match v {
        Some(s) if !(1..=MAX_SECONDS).contains(s.get_ref()) => Err(Diagnostic::at(
            s.span(),
            format!(
                "{key} must be between 1 and {MAX_SECONDS}, not {}",
                s.get_ref()
            ),
        )),
        Some(s) => Ok(s.into_inner()),
        None => Ok(default),
    }
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
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let first = std::path::PathBuf::from(&self.settings.template);
        // Fail now, not at the first frame, if the folder cannot take files (a folder named
        // after the source is made at the source's first image).
        if let Some(dir) = first
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.to_string_lossy().contains('{'))
        {
            super::create_parent(&first)?;
            tempfile_probe(dir, &first)?;
        }
        crate::gst_setup::init().map_err(|message| SinkError::Gstreamer {
            path: first.clone(),
            message,
        })?;
        let image = inputs
            .iter()
            .find(|i| i.port == "image")
            .map(|i| i.from)
            .ok_or_else(|| SinkError::Other("video_file: no image input".to_owned()))?;
        Ok(Box::new(VideoFile {
            settings: self.settings.clone(),
            image,
            encoders: HashMap::new(),
            files: storage.sink(name, self.policy),
            full: HashMap::new(),
            lost: Arc::default(),
            sizes: size::SaidOnce::default(),
        }))
    }

    fn single_source(&self) -> Option<Diagnostic> {
        self.mixes_sources.clone()
    }

    fn images_of(&self, width: u32, height: u32) -> Result<Option<String>, String> {
        size::images_of(width, height)
    }
}

/// Checks that files can be created in `dir` (creating and removing one); an error names
/// `output`, the file to be made there.
fn tempfile_probe(dir: &std::path::Path, output: &std::path::Path) -> Result<(), SinkError> {
    let probe = dir.join(format!(".vidflow-probe-{}", std::process::id()));
    let io = |source| SinkError::Io {
        path: output.to_owned(),
        source,
    };
    std::fs::File::create(&probe).map_err(io)?;
    std::fs::remove_file(&probe).map_err(io)
}

pub(super) struct VideoFile {
    settings: Settings,
    image: crate::spec::Ref,
    /// One per source, made at its first image.
    encoders: HashMap<Arc<str>, Encoder>,
    files: SinkFiles,
    /// Sources whose encoder stopped on a full disk: when to look for room again.
    full: HashMap<Arc<str>, (std::time::Instant, std::path::PathBuf)>,
    /// Frames taken (`write` said `Ok(true)`) that are in no finished segment: written by the
    /// encoders as they end (see `Encoder::settle`), read by the runner.
    lost: Arc<AtomicU64>,
    /// Padded or refused image sizes already logged.
    sizes: size::SaidOnce,
}

/// After a full disk, how often a source looks for room to start a new segment (frames in
/// between are counted as lost). Each look is one `statvfs`.
const FULL_RETRY: Duration = Duration::from_millis(500);
/// Free space a new segment needs after a full disk: less, and it would fail at once.
const ROOM_TO_RESTART: u64 = 4 << 20;

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

impl VideoFile {
    /// The image as a buffer of BGR rows at the size and stride GStreamer expects for `info`:
    /// the image's own memory when it is laid out that way (no copy), its rows copied
    /// otherwise. An image smaller than `info` (an odd or tiny size, see [`size`]) is padded:
    /// its last column and row repeated.
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
        let (width, height) = (info.width() as i32, info.height() as i32);
        let (right, bottom) = (width - mat.cols(), height - mat.rows());
        if right < 0 || bottom < 0 {
            return Err(SinkError::Other(format!(
                "video_file: an image of {}x{} for an encoder of {width}x{height}",
                mat.cols(),
                mat.rows()
            )));
        }
        let padded;
        let mat = if right > 0 || bottom > 0 {
            let mut out = Mat::default();
            opencv::core::copy_make_border(
                mat,
                &mut out,
                0,
                bottom,
                0,
                right,
                opencv::core::BORDER_REPLICATE,
                opencv::core::Scalar::default(),
            )
            .map_err(other)?;
            padded = out;
            &padded
        } else {
            mat
        };
        let stride = info.stride()[0] as usize;
        let row = info.width() as usize * 3;
        let untouched = own_memory && right == 0 && bottom == 0;
        if untouched && mat.is_continuous() && row == stride {
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

impl VideoFile {
    /// A source whose disk was full: `Some(error)` (the frame is lost) until there is room for
    /// a new segment, looked for every [`FULL_RETRY`].
    fn waiting_for_room(&mut self, source: &Arc<str>) -> Option<SinkError> {
        let (at, path) = self.full.get(source)?;
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
        let folder = folder.unwrap_or(std::path::Path::new("."));
        let lost = || SinkError::DiskFull { path: path.clone() };
        if at.elapsed() < FULL_RETRY {
            return Some(lost());
        }
        let room = crate::storage::space(folder).is_ok_and(|s| s.free >= ROOM_TO_RESTART)
            || self.files.disk_full(path) > 0;
        if !room {
            let e = lost();
            self.full
                .insert(source.clone(), (std::time::Instant::now(), path.clone()));
            return Some(e);
        }
        tracing::info!(source = %source, "room on the disk again: recording goes on in a new segment");
        self.full.remove(source);
        None
    }

    /// An encoder failed: on a full disk it is dropped (its segment ends at its last fragment),
    /// the storage purges by its policies, and a new segment starts as soon as there is room.
    fn after_failure(&mut self, source: &Arc<str>, e: SinkError) -> SinkError {
        let Some(enc) = self.encoders.get(source).filter(|enc| enc.out_of_space()) else {
            return e;
        };
        let path = enc
            .segment()
            .unwrap_or_else(|| std::path::PathBuf::from(&self.settings.template));
        if let Some(enc) = self.encoders.remove(source) {
            let _ = enc.close();
        }
        tracing::warn!(source = %source, path = %path.display(), "disk full: the segment ends at its last complete fragment");
        self.files.disk_full(&path);
        self.full
            .insert(source.clone(), (std::time::Instant::now(), path.clone()));
        SinkError::DiskFull { path }
    }
}

/// The format an encoder of images `image` at `rate` takes and the one of an image `width` x
/// `height` at `fps`, when they differ in size or frame rate (30/1 and 60/2 are the same
/// rate); `None` when the encoder fits the image.
pub(super) fn changed(
    (image, rate): ((u32, u32), gst::Fraction),
    width: u32,
    height: u32,
    fps: (i32, i32),
) -> Option<(Format, Format)> {
    if (image, rate) == ((width, height), gst::Fraction::new(fps.0, fps.1)) {
        return None;
    }
    let format = |(w, h): (u32, u32), fps| Format {
        width: i32::try_from(w).unwrap_or(i32::MAX),
        height: i32::try_from(h).unwrap_or(i32::MAX),
        fps,
    };
    let from = format(
        image,
        (rate.numer() > 0).then(|| (rate.numer(), rate.denom())),
    );
    Some((from, format((width, height), Some(fps))))
}

impl VideoFile {
    /// Closes the encoder of `source` (finalizing its segment) when its images are now
    /// `width` x `height` at `fps` and it encodes another size or frame rate: the next image
    /// starts a new encoder, whose first segment takes a new name and starts with a keyframe.
    /// A failure to finalize the old segment is logged: the new one is written all the same.
    fn close_if_changed(&mut self, source: &Arc<str>, width: u32, height: u32, fps: (i32, i32)) {
        let Some(enc) = self.encoders.get(source) else {
            return;
        };
        let Some((from, to)) = changed(enc.format(), width, height, fps) else {
            return;
        };
        tracing::info!(
            source = %source,
            "video_file: images of \"{source}\" went from {from} to {to}; its segment is closed \
             and a new one starts"
        );
        if let Some(enc) = self.encoders.remove(source)
            && let Err(e) = enc.close()
        {
            tracing::error!(source = %source, error = %e, "video_file: the segment before the change was not finalized");
        }
    }
}

impl Sink for VideoFile {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let Some(Value::Image(image)) = result.value(self.image) else {
            return Ok(false);
        };
        let (width, height, _) = image.shape();
        let frame = result.frame();
        if let Some(lost) = self.waiting_for_room(&frame.source) {
            return Err(lost);
        }
        let bad = |what: &str| SinkError::Other(format!("video_file: bad image {what}"));
        let w = u32::try_from(width).map_err(|_| bad("width"))?;
        let h = u32::try_from(height).map_err(|_| bad("height"))?;
        let fps = frame.fps.unwrap_or(DEFAULT_FPS);
        self.close_if_changed(&frame.source, w, h, fps);
        if !self.encoders.contains_key(&frame.source) {
            self.sizes.say("video_file", &frame.source, w, h);
        }
        let (files, lost) = (&self.files, &self.lost);
        let enc = match self.encoders.entry(frame.source.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let settings = Settings {
                    source: frame.source.to_string(),
                    ..self.settings.clone()
                };
                e.insert(Encoder::start(&settings, w, h, fps, files, lost.clone())?)
            }
        };
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
            (None, _) => enc.frame_duration * enc.pushed(),
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
        if let Err(e) = enc.push(buffer) {
            return Err(self.after_failure(&frame.source, e));
        }
        self.files.wrote();
        Ok(true)
    }

    fn lost_after_write(&self) -> Option<Arc<AtomicU64>> {
        Some(self.lost.clone())
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        if self.encoders.is_empty() {
            tracing::warn!(path = %self.settings.template, "no image was produced; no video file was written");
        }
        let mut first = Ok(());
        for (source, enc) in self.encoders {
            let out_of_space = enc.out_of_space();
            let closed = enc.close();
            if out_of_space && let Err(e) = &closed {
                // Counted already as lost frames; not a failure of the run on its own.
                tracing::warn!(source = %source, error = %e, "disk full at the stop: the last segment ends at its last complete fragment");
                continue;
            }
            if first.is_ok() {
                first = closed;
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use opencv::core::MatTrait;

    use super::*;

    #[test]
    fn another_size_or_frame_rate_is_a_change_and_the_same_rate_written_otherwise_is_not() {
        gst::init().unwrap();
        let info = ((320, 240), gst::Fraction::new(15, 1));
        assert_eq!(changed(info, 320, 240, (15, 1)), None);
        assert_eq!(changed(info, 320, 240, (30, 2)), None);
        let (from, to) = changed(info, 640, 480, (15, 1)).unwrap();
        assert_eq!(
            (from.to_string(), to.to_string()),
            (
                "320x240 at 15 fps".to_owned(),
                "640x480 at 15 fps".to_owned()
            )
        );
        assert!(changed(info, 320, 240, (30000, 1001)).is_some());
        assert!(changed(info, 240, 320, (15, 1)).is_some());
    }

    #[test]
    fn an_odd_image_is_padded_with_its_last_column_and_row() {
        gst::init().unwrap();
        // 5x3, each pixel (x, y) = (10 x, 10 y, 7).
        let mut mat = Mat::new_rows_cols_with_default(
            3,
            5,
            opencv::core::CV_8UC3,
            opencv::core::Scalar::all(0.0),
        )
        .unwrap();
        for y in 0..3 {
            for x in 0..5 {
                *mat.at_2d_mut::<opencv::core::Vec3b>(y, x).unwrap() =
                    opencv::core::Vec3b::from([10 * x as u8, 10 * y as u8, 7]);
            }
        }
        let (w, h) = size::coded_size(5, 3).unwrap();
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Bgr, w, h)
            .build()
            .unwrap();
        let buffer = VideoFile::buffer_for(&Image::from(mat), &info).unwrap();
        let map = buffer.map_readable().unwrap();
        assert_eq!(map.len(), info.size());
        let stride = info.stride()[0] as usize;
        let pixel = |x: usize, y: usize| &map[y * stride + 3 * x..y * stride + 3 * x + 3];
        assert_eq!(pixel(2, 1), &[20, 10, 7]);
        // Right of the image: its last column; below it: its last row.
        assert_eq!(pixel(15, 1), &[40, 10, 7]);
        assert_eq!(pixel(2, 15), &[20, 20, 7]);
        assert_eq!(pixel(15, 15), &[40, 20, 7]);
    }
}
