//! What flows between steps: images and detections.
//!
//! Values are cheap to clone (reference counted) because one output may feed several steps and
//! several sinks of the same frame, possibly on different threads.

use std::fmt;
use std::sync::Arc;

use opencv::core::Mat;
use serde::Serialize;

use crate::frame::Frame;

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

/// An image: either the decoded frame itself (zero-copy) or pixels a step produced.
#[derive(Clone)]
pub enum Image {
    Frame(Arc<Frame>),
    Owned(Arc<Mat>),
}

impl Image {
    pub fn mat(&self) -> &Mat {
        match self {
            Self::Frame(frame) => frame.mat(),
            Self::Owned(mat) => mat,
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
        use opencv::core::MatTraitConst;
        let mat = self.mat();
        write!(f, "Image({}x{}x{})", mat.cols(), mat.rows(), mat.channels())
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
