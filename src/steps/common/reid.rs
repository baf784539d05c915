//! What `line_counter` and `zone_count` share about tracks the tracker lost: how long one is
//! remembered (`reid_frames`), and how close a new ID must first be seen to where it was last
//! seen to take its place (`reid_distance`). So one object stays one object to a count while the
//! tracker misses it for a few frames (with `report_lost = 0` it is then absent from `tracks`)
//! or finds it again under a new ID.

use toml::Spanned;

use crate::spec::{Diagnostic, ParamDoc};

/// Default `reid_distance` (pixels): about a stride of a person near the camera.
pub(in crate::steps) const DEFAULT_REID_DISTANCE: f32 = 40.0;
/// Default `reid_frames`: a few seconds at common frame rates.
pub(in crate::steps) const DEFAULT_REID_FRAMES: u64 = 30;
/// Largest `reid_frames`.
const MAX_REID_FRAMES: u64 = 100_000;

pub(in crate::steps) const REID_DISTANCE_DOC: ParamDoc = ParamDoc {
    name: "reid_distance",
    ty: "float >= 0",
    default: "40.0",
    doc: "a new track ID first seen this close (pixels) to where a lost one was last seen takes its place, so it is not counted again: more catches longer jumps, and may merge two people (0: off)",
};

pub(in crate::steps) const REID_FRAMES_DOC: ParamDoc = ParamDoc {
    name: "reid_frames",
    ty: "integer in [0, 100000]",
    default: "30",
    doc: "frames a lost track is remembered, for its ID coming back or a new ID taking its place",
};

/// A lost track's memory, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::steps) struct Reid {
    pub distance: f32,
    pub frames: u64,
}

impl Default for Reid {
    fn default() -> Self {
        Self {
            distance: DEFAULT_REID_DISTANCE,
            frames: DEFAULT_REID_FRAMES,
        }
    }
}

impl Reid {
    /// `reid_distance` and `reid_frames` as written, or their defaults.
    pub(in crate::steps) fn parse(
        distance: Option<Spanned<f32>>,
        frames: Option<Spanned<i64>>,
    ) -> Result<Self, Diagnostic> {
        let distance = match distance {
            Some(d) if !(d.get_ref().is_finite() && *d.get_ref() >= 0.0) => {
                return Err(Diagnostic::at(
                    d.span(),
                    format!("reid_distance must be a number >= 0, not {}", d.get_ref()),
                ));
            }
            Some(d) => d.into_inner(),
            None => DEFAULT_REID_DISTANCE,
        };
        let frames = match frames {
            Some(n) => u64::try_from(*n.get_ref())
                .ok()
                .filter(|n| *n <= MAX_REID_FRAMES)
                .ok_or_else(|| {
                    Diagnostic::at(
                        n.span(),
                        format!(
                            "reid_frames must be a whole number from 0 to {MAX_REID_FRAMES}, not {}",
                            n.get_ref()
                        ),
                    )
                })?,
            None => DEFAULT_REID_FRAMES,
        };
        Ok(Self { distance, frames })
    }
}
