//! A decoded frame: where it came from, when, and its BGR pixels.
//!
//! Pixels decoded by GStreamer are never copied: the buffer is mapped read-only once, and an
//! OpenCV `Mat` header is built over the mapped plane with its real stride. The header lives in
//! the same struct as the mapping and is declared first, so it is dropped before the mapping is
//! released. Steps only ever get `&Mat`, so nothing can write into the decoder's buffer.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gstreamer as gst;
use gstreamer_video as gst_video;
use gstreamer_video::prelude::*;
use opencv::core::{CV_8UC3, Mat, MatTraitConst};

/// Why a buffer could not become a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("buffer does not match its caps: {0}")]
    Map(String),
    #[error("frame is not 8-bit BGR (format {0:?})")]
    Format(gst_video::VideoFormat),
    #[error("opencv: {0}")]
    OpenCv(#[from] opencv::Error),
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
    /// Nominal frame rate of the stream (numerator, denominator), when the source knows it.
    pub fps: Option<(i32, i32)>,
    /// Set on the first frame after the source reconnected: how long no frame came.
    pub reconnected: Option<Duration>,
    pixels: Pixels,
}

enum Pixels {
    /// A view into a mapped GStreamer buffer. Field order matters: `mat` is dropped first.
    Mapped {
        mat: Mat,
        _mapping: Box<gst_video::VideoFrame<gst_video::video_frame::Readable>>,
    },
    /// Pixels owned by OpenCV (still images, tests).
    Owned(Mat),
}

impl Frame {
    /// Wraps a decoded BGR buffer without copying it.
    pub fn from_buffer(
        source: Arc<str>,
        seq: u64,
        buffer: gst::Buffer,
        info: &gst_video::VideoInfo,
    ) -> Result<Self, FrameError> {
        if info.format() != gst_video::VideoFormat::Bgr {
            return Err(FrameError::Format(info.format()));
        }
        let pts = buffer.pts().map(Duration::from);
        let mapping = gst_video::VideoFrame::from_buffer_readable(buffer, info)
            .map_err(|_| FrameError::Map(format!("{}x{}", info.width(), info.height())))?;
        let stride = usize::try_from(mapping.plane_stride()[0])
            .map_err(|_| FrameError::Map("negative stride".to_owned()))?;
        let data = mapping
            .plane_data(0)
            .map_err(|e| FrameError::Map(e.to_string()))?;
        let rows = to_i32(mapping.height())?;
        let cols = to_i32(mapping.width())?;
        if data.len() < stride * (rows as usize - 1) + cols as usize * 3 {
            return Err(FrameError::Map(
                "plane smaller than its stride says".to_owned(),
            ));
        }
        // SAFETY: `data` points to `rows` rows of `stride` bytes (checked above), each holding
        // `cols` BGR pixels, and stays mapped for as long as `mapping` lives. The Mat header is
        // stored next to `mapping` and dropped before it (field order of `Pixels::Mapped`), and
        // it is only ever handed out as `&Mat`, so OpenCV never writes through the pointer.
        let mat = unsafe {
            Mat::new_rows_cols_with_data_unsafe(
                rows,
                cols,
                CV_8UC3,
                data.as_ptr().cast_mut().cast(),
                stride,
            )
        }?;
        let fps = info.fps();
        let fps = (fps.numer() > 0).then(|| (fps.numer(), fps.denom()));
        Ok(Self {
            source,
            seq,
            pts,
            captured: SystemTime::now(),
            fps,
            reconnected: None,
            pixels: Pixels::Mapped {
                mat,
                _mapping: Box::new(mapping),
            },
        })
    }

    /// A frame whose pixels OpenCV already owns.
    pub fn from_mat(source: Arc<str>, seq: u64, pts: Option<Duration>, mat: Mat) -> Self {
        Self {
            source,
            seq,
            pts,
            captured: SystemTime::now(),
            fps: None,
            reconnected: None,
            pixels: Pixels::Owned(mat),
        }
    }

    /// The BGR pixels.
    pub fn mat(&self) -> &Mat {
        match &self.pixels {
            Pixels::Mapped { mat, .. } | Pixels::Owned(mat) => mat,
        }
    }

    /// Whether the pixels are the decoder's buffer itself (no copy was made).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.pixels, Pixels::Mapped { .. })
    }

    pub fn width(&self) -> i32 {
        self.mat().cols()
    }

    pub fn height(&self) -> i32 {
        self.mat().rows()
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("source", &self.source)
            .field("seq", &self.seq)
            .field("pts", &self.pts)
            .field("size", &(self.width(), self.height()))
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}

fn to_i32(v: u32) -> Result<i32, FrameError> {
    i32::try_from(v).map_err(|_| FrameError::Map(format!("dimension {v} too large")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opencv::core::{MatTraitConst, Vec3b};

    #[test]
    fn mapped_frame_reads_pixels_in_place_with_padded_stride() {
        gst::init().unwrap();
        // 5 px wide BGR rows are 15 bytes; GStreamer pads them to a stride of 16.
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Bgr, 5, 2)
            .build()
            .unwrap();
        assert_eq!(info.stride()[0], 16);
        let mut bytes = vec![0u8; info.size()];
        bytes[16 + 3..16 + 6].copy_from_slice(&[1, 2, 3]); // row 1, column 1
        let ptr = bytes.as_ptr();
        let buffer = gst::Buffer::from_slice(bytes);
        let frame = Frame::from_buffer("cam".into(), 7, buffer, &info).unwrap();
        assert!(frame.is_zero_copy());
        assert_eq!((frame.width(), frame.height()), (5, 2));
        assert_eq!(
            *frame.mat().at_2d::<Vec3b>(1, 1).unwrap(),
            Vec3b::from([1, 2, 3])
        );
        assert_eq!(
            frame.mat().data(),
            ptr,
            "the Mat must point into the buffer"
        );
    }

    #[test]
    fn non_bgr_buffer_is_refused() {
        gst::init().unwrap();
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::I420, 4, 4)
            .build()
            .unwrap();
        let buffer = gst::Buffer::with_size(info.size()).unwrap();
        let err = Frame::from_buffer("cam".into(), 0, buffer, &info).unwrap_err();
        assert!(matches!(err, FrameError::Format(_)));
    }
}
