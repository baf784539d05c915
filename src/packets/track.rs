//! A video track as fragmented MP4 carries it, whichever codec: H.264 (`avc.rs`: an `avc1`
//! sample entry with its `avcC`) or H.265 (`hevc.rs`: `hvc1` with its `hvcC`), chosen by the
//! stream's caps. What the writer (`fmp4.rs`) and the live video endpoint need of a stream:
//! its configuration record, picture size, codec string and samples. No thread.

use std::borrow::Cow;

use gstreamer as gst;

use super::avc::{AvcConfig, AvcError};
use super::hevc::{HevcConfig, HevcError};

/// One stream's decoder configuration, by codec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Track {
    Avc(AvcConfig),
    Hevc(HevcConfig),
}

/// Why a stream's packets cannot go into MP4 as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrackError {
    #[error("its stream is {0}, neither H.264 nor H.265")]
    Other(String),
    #[error(transparent)]
    Avc(#[from] AvcError),
    #[error(transparent)]
    Hevc(#[from] HevcError),
}

impl Track {
    /// The configuration of a stream of `caps`, from them or from the parameter sets in
    /// `keyframe` (`None`: this packet has none, a later keyframe may).
    pub fn of(caps: &gst::CapsRef, keyframe: &[u8]) -> Result<Option<Self>, TrackError> {
        let name = caps.structure(0).map(|s| s.name().to_string());
        match name.as_deref() {
            Some("video/x-h264") => Ok(AvcConfig::of(caps, keyframe)?.map(Self::Avc)),
            Some("video/x-h265") => Ok(HevcConfig::of(caps, keyframe)?.map(Self::Hevc)),
            other => Err(TrackError::Other(other.unwrap_or("empty caps").to_owned())),
        }
    }

    /// The codec string for `MediaSource.isTypeSupported` (`avc1.64001f`, `hvc1.1.6.L93.B0`).
    pub fn codec(&self) -> String {
        match self {
            Self::Avc(c) => c.codec(),
            Self::Hevc(c) => c.codec(),
        }
    }

    /// An access unit as the sample entry says its NAL units are framed.
    pub fn sample<'a>(&self, unit: &'a [u8]) -> Cow<'a, [u8]> {
        match self {
            Self::Avc(c) => c.sample(unit),
            Self::Hevc(c) => c.sample(unit),
        }
    }

    /// Its parameter sets: two configurations with the same ones decode the same stream.
    pub fn parameter_sets(&self) -> &[u8] {
        match self {
            Self::Avc(c) => c.parameter_sets(),
            Self::Hevc(c) => c.parameter_sets(),
        }
    }

    /// The picture's width and height.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Self::Avc(c) => (c.width, c.height),
            Self::Hevc(c) => (c.width, c.height),
        }
    }

    /// The sample entry's type, its configuration box's type and that box's payload.
    pub fn sample_entry(&self) -> (&'static [u8; 4], &'static [u8; 4], &[u8]) {
        match self {
            Self::Avc(c) => (b"avc1", b"avcC", &c.record),
            Self::Hevc(c) => (b"hvc1", b"hvcC", &c.record),
        }
    }

    /// The `ftyp`'s compatible brands: `avc1` names the H.264 file format; H.265 has no brand
    /// of its own there.
    pub fn brands(&self) -> &'static [u8] {
        match self {
            Self::Avc(_) => b"isomiso6avc1mp41",
            Self::Hevc(_) => b"isomiso6mp41",
        }
    }
}
