//! What flows between steps: images and detections.
//!
//! Values are cheap to clone (reference counted) because one output may feed several steps and
//! several sinks of the same frame, possibly on different threads.

use std::fmt;
use std::sync::Arc;

use opencv::core::Mat;
use serde::Serialize;

use crate::frame::{Frame, FrameError};

/// The type of a step input or output, checked when the pipeline is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    Image,
    Detections,
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Image => "image",
            Self::Detections => "detections",
        })
    }
}

/// A value produced by a step (or the decoded frame itself).
#[derive(Debug, Clone)]
pub enum Value {
    Image(Image),
    Detections(Arc<[Detection]>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::Image(_) => ValueType::Image,
            Self::Detections(_) => ValueType::Detections,
        }
    }

    pub fn as_image(&self) -> Option<&Image> {
        match self {
            Self::Image(image) => Some(image),
            Self::Detections(_) => None,
        }
    }

    pub fn as_detections(&self) -> Option<&[Detection]> {
        match self {
            Self::Detections(d) => Some(d),
            Self::Image(_) => None,
        }
    }
}

/// An image: the decoded frame itself (zero-copy; BGR made on first use), its luma plane, or
/// pixels a step produced.
#[derive(Clone)]
pub enum Image {
    Frame(Arc<Frame>),
    /// The frame's luma plane as a grey image (only for frames that have one).
    Luma(Arc<Frame>),
    Owned(Arc<Mat>),
}

impl Image {
    pub fn mat(&self) -> Result<&Mat, FrameError> {
        match self {
            Self::Frame(frame) => frame.bgr(),
            Self::Luma(frame) => frame
                .luma()
                .ok_or_else(|| FrameError::Map("frame has no luma plane".to_owned())),
            Self::Owned(mat) => Ok(mat),
        }
    }

    /// Width, height and channels, without converting anything.
    pub fn shape(&self) -> (i32, i32, i32) {
        use opencv::core::MatTraitConst;
        match self {
            Self::Frame(f) => (f.width(), f.height(), 3),
            Self::Luma(f) => (f.width(), f.height(), 1),
            Self::Owned(m) => (m.cols(), m.rows(), m.channels()),
        }
    }
}

impl From<Mat> for Image {
    fn from(mat: Mat) -> Self {
        Self::Owned(Arc::new(mat))
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (w, h, c) = self.shape();
        write!(f, "Image({w}x{h}x{c})")
    }
}

/// An axis-aligned box in pixel coordinates of the image it was found in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BBox {
    /// Left edge.
    pub x: f32,
    /// Top edge.
    pub y: f32,
    pub width: f32,
    pub height: f32,
}

/// One detected object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    pub class: Arc<str>,
    pub confidence: f32,
    #[serde(rename = "box")]
    pub bbox: BBox,
}
