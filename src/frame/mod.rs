//! A decoded frame: where it came from, when, and its pixels.
//!
//! Pixels decoded by GStreamer are never copied to hand them over: the buffer is mapped
//! read-only once and OpenCV `Mat` headers are built over its planes with their real strides.
//! Sources deliver I420 or NV12 as the decoder made them (or BGR when that is what they have);
//! the BGR image is converted with OpenCV the first time a step asks for it, on that step's
//! worker, so the conversion runs in the pool in parallel with decoding (one frame per worker),
//! and not at all when no step needs colour. The luma plane is available as a grey image
//! without any conversion, and a step that needs only part of the frame or a smaller size
//! converts only that ([`Frame::bgr_region`], [`Frame::bgr_resized`]; see `convert`).
//!
//! Memory: a frame holds its decoder buffer (1.5 bytes a pixel for I420/NV12) and, once made,
//! its BGR image (3 bytes a pixel), until the last reference to it is dropped: the workflow's and
//! the sinks' (a result keeps its frame). How many frames a run holds at once: README "Memory".
//! A source whose decoder has a small fixed pool holds only some of its buffers; its other
//! frames are copies ([`Frame::from_decoder`], `pins`).
//!
//! The headers live in the same struct as the mapping and are declared first, so they are
//! dropped before the mapping is released. Steps only ever get `&Mat`, so nothing can write
//! into the decoder's buffer.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

pub use blob::{BlobSpec, bgr_blob};
pub use clock::CameraClock;
pub use ground::{Ground, GroundError};
use gstreamer as gst;
use gstreamer_video as gst_video;
use gstreamer_video::prelude::*;
use opencv::core::{CV_8UC1, CV_8UC2, CV_8UC3, Mat, MatTraitConst, Rect, Size};
use opencv::imgproc;
pub use pins::{Pins, PoolSize, UNKNOWN_POOL_PINS};
pub use place::{Place, Placement};

mod blob;
mod clock;
mod convert;
mod ground;
mod pins;
mod place;
#[cfg(test)]
pub(crate) mod test_video;

/// Why a buffer could not become a frame, or a frame an image.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FrameError {
    #[error("buffer does not match its caps: {0}")]
    Map(String),
    #[error("unsupported pixel format {0:?} (expected I420, NV12 or BGR)")]
    Format(gst_video::VideoFormat),
    #[error("opencv: {0}")]
    OpenCv(String),
    #[error("region {0}")]
    Region(String),
}

impl From<opencv::Error> for FrameError {
    fn from(e: opencv::Error) -> Self {
        Self::OpenCv(e.to_string())
    }
}

/// Images up to this size are taken from the heap and reused, not mapped afresh for each
/// frame: a 4K BGR image is 25 MB, and glibc accepts at most 32 MiB here.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free heap memory kept for the next frames instead of being returned to the system, where it
/// would be faulted in again page by page; the run's peak is bounded (README "Memory").
const TRIM_THRESHOLD: i32 = 64 << 20;

/// Makes the allocator keep freed frame-sized blocks. By default glibc maps every block over
/// 128 KiB (a BGR image, a copy a step makes) afresh and returns it at once when freed, so
/// every frame pays for hundreds of page faults per image and the kernel work of unmapping it:
/// on a 720p whole-frame BGR workflow, 480 faults and 3 ms of system time per frame. Measured
/// with 3000 720p frames through `resize`, `crop` and `grayscale` of `$frame`: 15 400 page
/// faults instead of 291 000, peak RSS 53 MiB instead of 67. The arena count is left alone:
/// capping it at two slowed a live blur workflow (`tests/live.rs`) by lock contention. Call
/// once at start, before threads allocate; does nothing where the allocator is not glibc's.
pub fn keep_freed_images() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (param, value) in [
        (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ] {
        // SAFETY: mallopt only sets allocator parameters; both values are in the range glibc
        // documents, and a refused one (return 0) leaves the default in place.
        if unsafe { libc::mallopt(param, value) } == 0 {
            tracing::warn!(param, value, "the allocator refused a setting");
        }
    }
}

/// The size and nominal frame rate of a source's frames: what a camera reconfigured, a
/// sub-stream swapped or a file whose caps change mid-stream changes. Not the pixel format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub width: i32,
    pub height: i32,
    /// Frames per second (numerator, denominator), when the stream says.
    pub fps: Option<(i32, i32)>,
}

impl Format {
    /// The format GStreamer's `info` describes.
    pub fn of(info: &gst_video::VideoInfo) -> Self {
        let fps = info.fps();
        Self {
            width: i32::try_from(info.width()).unwrap_or(i32::MAX),
            height: i32::try_from(info.height()).unwrap_or(i32::MAX),
            fps: (fps.numer() > 0).then(|| (fps.numer(), fps.denom())),
        }
    }

    /// Whether `other` has the same width and height.
    pub fn same_size(&self, other: &Self) -> bool {
        (self.width, self.height) == (other.width, other.height)
    }
}

/// `640x480 at 30 fps`, `640x480 at 30000/1001 fps`, or `640x480` without a frame rate.
impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)?;
        match self.fps {
            Some((n, 1)) => write!(f, " at {n} fps"),
            Some((n, d)) => write!(f, " at {n}/{d} fps"),
            None => Ok(()),
        }
    }
}

/// One frame of one source.
pub struct Frame {
    /// Name of the source (`[sources.NAME]`).
    pub source: Arc<str>,
    /// Position in the source's stream, counted from 0 and continuous across reconnects.
    pub seq: u64,
    /// Presentation timestamp given by the source, if it had one.
    pub pts: Option<Duration>,
    /// Wall-clock time at which the frame left the decoder.
    pub captured: SystemTime,
    /// The camera's clock on the frame's connection (a live RTSP stream), which places `pts`
    /// on it once the camera sent a sender report.
    pub clock: Option<Arc<CameraClock>>,
    /// Nominal frame rate of the stream (numerator, denominator), when the source knows it.
    pub fps: Option<(i32, i32)>,
    /// Set on the first frame after the source reconnected: how long no frame came.
    pub reconnected: Option<Duration>,
    /// The source's ground calibration (`[sources.NAME.calibration]`), when it has one.
    pub ground: Option<Arc<Ground>>,
    width: i32,
    height: i32,
    pixels: Pixels,
}

enum Pixels {
    /// Views into a mapped GStreamer buffer. Field order matters: every `Mat` is dropped before
    /// `_mapping`, and the buffer goes back to its pool before `origin` counts it back.
    Mapped {
        /// BGR, converted on first use (or the buffer itself when it is BGR).
        bgr: OnceLock<Result<Mat, FrameError>>,
        planes: Planes,
        _mapping: Box<gst_video::VideoFrame<gst_video::video_frame::Readable>>,
        origin: Origin,
    },
    /// Pixels owned by OpenCV (still images, tests).
    Owned(Result<Mat, FrameError>),
}

/// Whose buffer is mapped.
#[derive(Debug)]
enum Origin {
    /// The decoder's own; counted against its source's [`Pins`] (until the frame is dropped)
    /// when it has some.
    Decoder { _pin: Option<pins::Pin> },
    /// A copy in memory of its own: the decoder's buffer went back at once.
    Copy,
}

/// Zero-copy views of the mapped planes, each with its own stride.
enum Planes {
    Bgr,
    /// I420: luma, and the two chroma planes at half resolution (rounded up). `packed` is the
    /// whole image as one `height * 3 / 2` by `width` Mat (OpenCV's layout) when the planes lie
    /// back to back that way, so a full conversion reads the buffer in place.
    I420 {
        y: Mat,
        u: Mat,
        v: Mat,
        packed: Option<Mat>,
    },
    /// NV12: luma, and interleaved chroma at half resolution (rounded up).
    Nv12 {
        y: Mat,
        uv: Mat,
    },
}

/// A plane of the mapping: its bytes and its stride, checked to hold `rows` rows of
/// `row_bytes` bytes.
fn plane(
    mapping: &gst_video::VideoFrame<gst_video::video_frame::Readable>,
    index: u32,
    rows: i32,
    row_bytes: usize,
) -> Result<(&[u8], usize), FrameError> {
    let data = mapping
        .plane_data(index)
        .map_err(|e| FrameError::Map(e.to_string()))?;
    let stride = usize::try_from(mapping.plane_stride()[index as usize])
        .map_err(|_| FrameError::Map("negative stride".to_owned()))?;
    let rows = usize::try_from(rows).map_err(|_| FrameError::Map("bad height".to_owned()))?;
    if rows == 0 || stride < row_bytes || data.len() < stride * (rows - 1) + row_bytes {
        return Err(FrameError::Map(format!(
            "plane {index} smaller than its stride says"
        )));
    }
    Ok((data, stride))
}

/// A Mat header over plane `index`: `rows` by `cols` pixels of `typ` (`px_bytes` each).
/// Returns the header, the plane's first byte and its stride.
fn plane_view(
    mapping: &gst_video::VideoFrame<gst_video::video_frame::Readable>,
    index: u32,
    rows: i32,
    cols: i32,
    typ: i32,
    px_bytes: usize,
) -> Result<(Mat, *const u8, usize), FrameError> {
    let (data, stride) = plane(mapping, index, rows, cols as usize * px_bytes)?;
    // SAFETY: `plane` checked that `data` holds `rows` rows of `stride` bytes, each with
    // `cols * px_bytes` bytes of pixels. `data` stays mapped as long as `mapping` lives; every
    // caller stores the header in `Pixels::Mapped`, which drops it before the mapping, and only
    // hands it out as `&Mat`, so OpenCV never writes through the pointer.
    let mat = unsafe {
        Mat::new_rows_cols_with_data_unsafe(
            rows,
            cols,
            typ,
            data.as_ptr().cast_mut().cast(),
            stride,
        )
    }?;
    Ok((mat, data.as_ptr(), stride))
}

impl Frame {
    /// Wraps a decoded I420, NV12 or BGR buffer without copying it.
    pub fn from_buffer(
        source: Arc<str>,
        seq: u64,
        buffer: gst::Buffer,
        info: &gst_video::VideoInfo,
    ) -> Result<Self, FrameError> {
        Self::wrap(source, seq, buffer, info, Origin::Decoder { _pin: None })
    }

    /// Wraps a decoded buffer like [`Frame::from_buffer`] while `pins` lets the source's frames
    /// hold one more; past that, copies its pixels into memory of the frame's own and lets the
    /// buffer go back to the decoder's pool at once (the frame is then not zero-copy).
    pub fn from_decoder(
        source: Arc<str>,
        seq: u64,
        buffer: gst::Buffer,
        info: &gst_video::VideoInfo,
        pins: &Pins,
    ) -> Result<Self, FrameError> {
        match pins.take() {
            Some(pin) => Self::wrap(
                source,
                seq,
                buffer,
                info,
                Origin::Decoder { _pin: Some(pin) },
            ),
            None => Self::wrap(source, seq, copy_out(buffer, info)?, info, Origin::Copy),
        }
    }

    fn wrap(
        source: Arc<str>,
        seq: u64,
        buffer: gst::Buffer,
        info: &gst_video::VideoInfo,
        origin: Origin,
    ) -> Result<Self, FrameError> {
        let format = info.format();
        if !matches!(
            format,
            gst_video::VideoFormat::Bgr
                | gst_video::VideoFormat::I420
                | gst_video::VideoFormat::Nv12
        ) {
            return Err(FrameError::Format(format));
        }
        let pts = buffer.pts().map(Duration::from);
        let mapping = gst_video::VideoFrame::from_buffer_readable(buffer, info)
            .map_err(|_| FrameError::Map(format!("{}x{}", info.width(), info.height())))?;
        let to_i32 = |v: u32| {
            i32::try_from(v).map_err(|_| FrameError::Map(format!("dimension {v} too large")))
        };
        let (w, h) = (to_i32(mapping.width())?, to_i32(mapping.height())?);
        let (wu, hu) = (w as usize, h as usize);
        // GStreamer's chroma planes cover odd sizes: half the luma size, rounded up.
        let (cw, ch) = ((w + 1) / 2, (h + 1) / 2);
        let bgr = OnceLock::new();
        let planes = match format {
            gst_video::VideoFormat::Bgr => {
                let _ = bgr.set(Ok(plane_view(&mapping, 0, h, w, CV_8UC3, 3)?.0));
                Planes::Bgr
            }
            gst_video::VideoFormat::Nv12 => Planes::Nv12 {
                y: plane_view(&mapping, 0, h, w, CV_8UC1, 1)?.0,
                uv: plane_view(&mapping, 1, ch, cw, CV_8UC2, 2)?.0,
            },
            _ => {
                let (y, y_at, ys) = plane_view(&mapping, 0, h, w, CV_8UC1, 1)?;
                let (u, u_at, us) = plane_view(&mapping, 1, ch, cw, CV_8UC1, 1)?;
                let (v, v_at, vs) = plane_view(&mapping, 2, ch, cw, CV_8UC1, 1)?;
                let is_packed = w % 2 == 0
                    && h % 2 == 0
                    && ys == wu
                    && us == wu / 2
                    && vs == wu / 2
                    && u_at == y_at.wrapping_add(wu * hu)
                    && v_at == u_at.wrapping_add(wu / 2 * (hu / 2));
                let packed = if is_packed {
                    // SAFETY: the three planes were just checked to lie back to back with
                    // strides w, w/2 and w/2, so `y_at` starts `w * h * 3 / 2` mapped bytes:
                    // OpenCV's I420 layout. Stored and handed out like every plane view (see
                    // `plane_view`).
                    Some(unsafe {
                        Mat::new_rows_cols_with_data_unsafe(
                            h * 3 / 2,
                            w,
                            CV_8UC1,
                            y_at.cast_mut().cast(),
                            wu,
                        )
                    }?)
                } else {
                    None
                };
                Planes::I420 { y, u, v, packed }
            }
        };
        let fps = Format::of(info).fps;
        Ok(Self {
            source,
            seq,
            pts,
            captured: SystemTime::now(),
            clock: None,
            fps,
            reconnected: None,
            ground: None,
            width: w,
            height: h,
            pixels: Pixels::Mapped {
                bgr,
                planes,
                _mapping: Box::new(mapping),
                origin,
            },
        })
    }

    /// A frame whose BGR pixels OpenCV already owns.
    pub fn from_mat(source: Arc<str>, seq: u64, pts: Option<Duration>, mat: Mat) -> Self {
        Self {
            source,
            seq,
            pts,
            captured: SystemTime::now(),
            clock: None,
            fps: None,
            reconnected: None,
            ground: None,
            width: mat.cols(),
            height: mat.rows(),
            pixels: Pixels::Owned(Ok(mat)),
        }
    }

    /// The frame's place in its stream's time, seconds: its timestamp (continuous across
    /// reconnections), else its number at the nominal frame rate (25 a second without one).
    /// What steps measure durations and speeds in: frame time, never the time of processing.
    pub fn stream_time_s(&self) -> f64 {
        if let Some(pts) = self.pts {
            return pts.as_secs_f64();
        }
        let (n, d) = self
            .fps
            .filter(|(n, d)| *n > 0 && *d > 0)
            .unwrap_or((25, 1));
        self.seq as f64 * f64::from(d) / f64::from(n)
    }

    /// The BGR pixels, converted on first use.
    pub fn bgr(&self) -> Result<&Mat, FrameError> {
        match &self.pixels {
            Pixels::Owned(mat) => mat.as_ref().map_err(Clone::clone),
            Pixels::Mapped { bgr, planes, .. } => bgr
                .get_or_init(|| match planes {
                    Planes::Bgr => Err(FrameError::Map("BGR view missing".to_owned())),
                    Planes::I420 {
                        packed: Some(all), ..
                    } => {
                        let mut out = Mat::default();
                        imgproc::cvt_color_def(all, &mut out, imgproc::COLOR_YUV2BGR_I420)?;
                        Ok(out)
                    }
                    Planes::I420 { y, u, v, .. } => convert::i420_to_bgr(y, u, v),
                    Planes::Nv12 { y, uv } => convert::nv12_to_bgr(y, uv),
                })
                .as_ref()
                .map_err(Clone::clone),
        }
    }

    /// The YUV planes when the BGR image has not been made (then converting part of them is
    /// cheaper than converting all); `None` when BGR is there already.
    fn yuv_only(&self) -> Option<&Planes> {
        match &self.pixels {
            Pixels::Mapped { bgr, planes, .. }
                if bgr.get().is_none() && !matches!(planes, Planes::Bgr) =>
            {
                Some(planes)
            }
            _ => None,
        }
    }

    /// The BGR pixels of `rect`, as an image of their own. Only the planes' pixels inside the
    /// rectangle (rounded out to even edges: chroma is shared by 2x2 pixels) are converted,
    /// unless the frame's BGR image exists already or the rectangle is the whole frame.
    pub fn bgr_region(&self, rect: Rect) -> Result<Mat, FrameError> {
        if rect.x < 0
            || rect.y < 0
            || rect.width < 1
            || rect.height < 1
            || rect.x + rect.width > self.width
            || rect.y + rect.height > self.height
        {
            return Err(FrameError::Region(format!(
                "{}x{} at ({}, {}) does not fit the {}x{} frame",
                rect.width, rect.height, rect.x, rect.y, self.width, self.height
            )));
        }
        let whole = rect == Rect::new(0, 0, self.width, self.height);
        let Some(planes) = self.yuv_only().filter(|_| !whole) else {
            return Ok(Mat::roi(self.bgr()?, rect)?.try_clone()?);
        };
        let (luma, chroma) = convert::aligned(rect, self.width, self.height);
        let part = match planes {
            Planes::I420 { y, u, v, .. } => convert::i420_to_bgr(
                &Mat::roi(y, luma)?,
                &Mat::roi(u, chroma)?,
                &Mat::roi(v, chroma)?,
            )?,
            Planes::Nv12 { y, uv } => {
                convert::nv12_to_bgr(&Mat::roi(y, luma)?, &Mat::roi(uv, chroma)?)?
            }
            Planes::Bgr => return Err(FrameError::Map("BGR view missing".to_owned())),
        };
        let inner = Rect::new(rect.x - luma.x, rect.y - luma.y, rect.width, rect.height);
        if inner == Rect::new(0, 0, part.cols(), part.rows()) {
            return Ok(part);
        }
        Ok(Mat::roi(&part, inner)?.try_clone()?)
    }

    /// The BGR image scaled to `size` with OpenCV's `interpolation`, as an image of its own.
    /// When the frame is scaled down and its BGR image was not made, the planes are scaled
    /// first (luma to `size`, chroma to half of it) and only the small result is converted.
    pub fn bgr_resized(&self, size: Size, interpolation: i32) -> Result<Mat, FrameError> {
        let smaller = i64::from(size.width) * i64::from(size.height)
            <= i64::from(self.width) * i64::from(self.height);
        let planes = self
            .yuv_only()
            .filter(|_| smaller && size.width > 0 && size.height > 0);
        let chroma = convert::chroma_size(size);
        match planes {
            Some(Planes::I420 { y, u, v, .. }) => convert::i420_to_bgr(
                &convert::scaled(y, size, interpolation)?,
                &convert::scaled(u, chroma, interpolation)?,
                &convert::scaled(v, chroma, interpolation)?,
            ),
            Some(Planes::Nv12 { y, uv }) => convert::nv12_to_bgr(
                &convert::scaled(y, size, interpolation)?,
                &convert::scaled(uv, chroma, interpolation)?,
            ),
            _ => convert::scaled(self.bgr()?, size, interpolation),
        }
    }

    /// The luma plane as a one-channel image, without conversion, when the frame is YUV.
    pub fn luma(&self) -> Option<&Mat> {
        match &self.pixels {
            Pixels::Mapped {
                planes: Planes::I420 { y, .. } | Planes::Nv12 { y, .. },
                ..
            } => Some(y),
            _ => None,
        }
    }

    /// Whether the pixels are the decoder's buffer itself (no copy was made to hand them over).
    pub fn is_zero_copy(&self) -> bool {
        matches!(
            self.pixels,
            Pixels::Mapped {
                origin: Origin::Decoder { .. },
                ..
            }
        )
    }

    /// Whether the BGR image has been made (or was there from the start).
    pub fn has_bgr(&self) -> bool {
        match &self.pixels {
            Pixels::Owned(_) => true,
            Pixels::Mapped { bgr, .. } => bgr.get().is_some(),
        }
    }

    pub fn width(&self) -> i32 {
        self.width
    }

    pub fn height(&self) -> i32 {
        self.height
    }

    /// Its size and nominal frame rate.
    pub fn format(&self) -> Format {
        Format {
            width: self.width,
            height: self.height,
            fps: self.fps,
        }
    }
}

/// The frame in `buffer`, copied plane by plane into a buffer of plain memory (no pool) laid
/// out as `info` says, with its timestamp; `buffer` is released before this returns.
fn copy_out(buffer: gst::Buffer, info: &gst_video::VideoInfo) -> Result<gst::Buffer, FrameError> {
    let unmappable = || FrameError::Map(format!("{}x{}", info.width(), info.height()));
    let pts = buffer.pts();
    let from =
        gst_video::VideoFrame::from_buffer_readable(buffer, info).map_err(|_| unmappable())?;
    let mut owned =
        gst::Buffer::with_size(info.size()).map_err(|e| FrameError::Map(e.to_string()))?;
    if let Some(owned) = owned.get_mut() {
        owned.set_pts(pts);
    }
    let mut to =
        gst_video::VideoFrame::from_buffer_writable(owned, info).map_err(|_| unmappable())?;
    from.copy(&mut to)
        .map_err(|e| FrameError::Map(format!("cannot copy the frame: {e}")))?;
    Ok(to.into_buffer())
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("source", &self.source)
            .field("seq", &self.seq)
            .field("pts", &self.pts)
            .field("size", &(self.width, self.height))
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opencv::core::{MatTraitConst, Vec3b};

    fn info(format: gst_video::VideoFormat, w: u32, h: u32) -> gst_video::VideoInfo {
        gst::init().unwrap();
        gst_video::VideoInfo::builder(format, w, h).build().unwrap()
    }

    #[test]
    fn mapped_bgr_frame_reads_pixels_in_place_with_padded_stride() {
        // 5 px wide BGR rows are 15 bytes; GStreamer pads them to a stride of 16.
        let info = info(gst_video::VideoFormat::Bgr, 5, 2);
        assert_eq!(info.stride()[0], 16);
        let mut bytes = vec![0u8; info.size()];
        bytes[16 + 3..16 + 6].copy_from_slice(&[1, 2, 3]); // row 1, column 1
        let ptr = bytes.as_ptr();
        let frame =
            Frame::from_buffer("cam".into(), 7, gst::Buffer::from_slice(bytes), &info).unwrap();
        assert!(frame.is_zero_copy());
        assert_eq!((frame.width(), frame.height()), (5, 2));
        let bgr = frame.bgr().unwrap();
        assert_eq!(*bgr.at_2d::<Vec3b>(1, 1).unwrap(), Vec3b::from([1, 2, 3]));
        assert_eq!(bgr.data(), ptr, "the Mat must point into the buffer");
    }

    /// An I420 buffer of one flat colour (Y, U, V), converted by OpenCV to BGR.
    fn flat_i420(w: u32, h: u32, yuv: [u8; 3]) -> (Frame, *const u8) {
        let info = info(gst_video::VideoFormat::I420, w, h);
        let mut bytes = vec![0u8; info.size()];
        let offsets = info.offset();
        let (u, v) = (offsets[1], offsets[2]);
        bytes[..u].fill(yuv[0]);
        bytes[u..v].fill(yuv[1]);
        bytes[v..].fill(yuv[2]);
        let ptr = bytes.as_ptr();
        (
            Frame::from_buffer("cam".into(), 0, gst::Buffer::from_slice(bytes), &info).unwrap(),
            ptr,
        )
    }

    #[test]
    fn i420_frames_give_luma_for_free_and_bgr_on_first_use() {
        // Pure red in BT.601 limited range: Y 81, U 90, V 240.
        let (frame, ptr) = flat_i420(64, 32, [81, 90, 240]);
        assert!(frame.is_zero_copy());
        let luma = frame.luma().unwrap();
        assert_eq!(luma.data(), ptr);
        assert_eq!(*luma.at_2d::<u8>(5, 5).unwrap(), 81);
        assert!(!frame.has_bgr());
        let px = *frame.bgr().unwrap().at_2d::<Vec3b>(10, 10).unwrap();
        assert!(px[2] > 230 && px[1] < 25 && px[0] < 25, "{px:?}");
        assert!(frame.has_bgr());
    }

    #[test]
    fn i420_with_padded_strides_is_read_in_place_and_converted() {
        // 10 px wide: chroma rows of 5 bytes are padded to 8, so the planes are not packed.
        let (frame, ptr) = flat_i420(10, 4, [81, 90, 240]);
        assert!(frame.is_zero_copy());
        assert_eq!(frame.luma().unwrap().data(), ptr);
        let px = *frame.bgr().unwrap().at_2d::<Vec3b>(3, 9).unwrap();
        assert!(px[2] > 230 && px[1] < 25 && px[0] < 25, "{px:?}");
        assert_eq!(*frame.luma().unwrap().at_2d::<u8>(3, 9).unwrap(), 81);
    }

    #[test]
    fn nv12_frames_convert_from_two_planes() {
        let info = info(gst_video::VideoFormat::Nv12, 32, 16);
        let mut bytes = vec![0u8; info.size()];
        let uv = info.offset()[1];
        bytes[..uv].fill(81);
        for pair in bytes[uv..].chunks_mut(2) {
            pair.copy_from_slice(&[90, 240][..pair.len()]);
        }
        let frame =
            Frame::from_buffer("cam".into(), 0, gst::Buffer::from_slice(bytes), &info).unwrap();
        let px = *frame.bgr().unwrap().at_2d::<Vec3b>(4, 4).unwrap();
        assert!(px[2] > 230 && px[1] < 25 && px[0] < 25, "{px:?}");
    }

    #[test]
    fn other_formats_are_refused() {
        let info = info(gst_video::VideoFormat::Yuy2, 4, 4);
        let buffer = gst::Buffer::with_size(info.size()).unwrap();
        let err = Frame::from_buffer("cam".into(), 0, buffer, &info).unwrap_err();
        assert!(matches!(err, FrameError::Format(_)));
    }
}
