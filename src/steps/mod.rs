//! Step kinds: what a `[steps.NAME]` table can ask for.
//!
//! A kind is a static descriptor (ports, parameters, whether it keeps state across frames) plus
//! a builder that turns the user's parameters into a runnable [`Step`]. Adding a kind means one
//! file or folder here and one line in [`KINDS`] (helpers go in `common/`). Inputs are not
//! parameters: the config layer takes each declared input key out of the table and resolves it
//! as a reference before the builder runs.

use std::fmt;
use std::sync::Arc;

use crate::frame::{Format, Frame};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Detection, FromValue, Image, Value, ValueType};

mod annotate;
mod blur;
mod blur_regions;
mod cascade_detection;
mod common;
mod crop;
mod face_detection;
mod filter;
mod grayscale;
mod line_counter;
mod motion;
mod object_detection;
mod people_detection;
mod resize;
mod tracker;
mod zone_count;

pub use crate::frame::{Place, Placement};

/// Every step kind, in the order `vidflow steps` lists them.
pub static KINDS: &[&StepKind] = &[
    &resize::KIND,
    &grayscale::KIND,
    &blur::KIND,
    &crop::KIND,
    &motion::KIND,
    &object_detection::KIND,
    &face_detection::KIND,
    &people_detection::KIND,
    &cascade_detection::KIND,
    &tracker::KIND,
    &filter::KIND,
    &zone_count::KIND,
    &line_counter::KIND,
    &blur_regions::KIND,
    &annotate::KIND,
];

/// What this machine runs, for `vidflow engines`: the CPU's vector extensions and each
/// inference engine with the precisions it computes in here.
pub fn engines_here() -> String {
    common::inference::here::report()
}

/// Looks a kind up by the name used in `kind = "..."`.
pub fn kind(name: &str) -> Option<&'static StepKind> {
    KINDS.iter().copied().find(|k| k.name == name)
}

/// A named, typed input or output.
#[derive(Debug, Clone, Copy)]
pub struct Port {
    pub name: &'static str,
    pub ty: ValueType,
    /// An optional input may be left out of the step's table, and a step still runs when the
    /// step it reads was skipped on a frame (it sees no value there). Always false for outputs.
    pub optional: bool,
}

/// Builds a step from its parameters (inputs already removed).
pub type BuildStep = fn(Params<'_>) -> Result<Box<dyn Step>, Diagnostic>;

/// Static description of a step kind.
#[derive(Debug)]
pub struct StepKind {
    pub name: &'static str,
    pub summary: &'static str,
    pub inputs: &'static [Port],
    pub outputs: &'static [Port],
    pub params: &'static [ParamDoc],
    /// A stateful step sees the frames of a source strictly in order, one at a time.
    pub stateful: bool,
    pub build: BuildStep,
}

impl StepKind {
    pub fn output(&self, name: &str) -> Option<(usize, &Port)> {
        self.outputs
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
    }
}

/// What a step sees when it runs: the frame and its resolved inputs, in port order (`None`
/// only at an optional port that was left out or whose step was skipped on this frame).
#[derive(Debug)]
pub struct StepInput<'a> {
    pub frame: &'a Frame,
    pub values: &'a [Option<Value>],
}

impl StepInput<'_> {
    /// The input at `port` as `T` (`Image`, `[Detection]`, ...).
    pub fn get<T: FromValue + ?Sized>(&self, port: usize) -> Result<&T, StepError> {
        self.optional(port)?.ok_or(StepError::Input(port, T::TYPE))
    }

    /// The optional input at `port` as `T`, or `None` when there is none on this frame.
    pub fn optional<T: FromValue + ?Sized>(&self, port: usize) -> Result<Option<&T>, StepError> {
        match self.values.get(port) {
            Some(Some(value)) => value
                .get::<T>()
                .map(Some)
                .ok_or(StepError::Input(port, T::TYPE)),
            Some(None) => Ok(None),
            None => Err(StepError::Input(port, T::TYPE)),
        }
    }

    /// The image at `port` as pixels (a frame is converted to BGR on first use).
    pub fn image(&self, port: usize) -> Result<&opencv::core::Mat, StepError> {
        self.get::<Image>(port)?.mat().map_err(StepError::Frame)
    }

    /// The image at `port` with `channels` channels (1: grey, 3: BGR), converted only when it
    /// has the other count.
    pub fn image_as(
        &self,
        port: usize,
        channels: i32,
    ) -> Result<std::borrow::Cow<'_, opencv::core::Mat>, StepError> {
        use opencv::core::MatTraitConst;
        use opencv::imgproc;
        let image = self.image(port)?;
        let code = match (image.channels(), channels) {
            (3, 1) => imgproc::COLOR_BGR2GRAY,
            (1, 3) => imgproc::COLOR_GRAY2BGR,
            _ => return Ok(std::borrow::Cow::Borrowed(image)),
        };
        let mut out = opencv::core::Mat::default();
        imgproc::cvt_color_def(image, &mut out, code)?;
        Ok(std::borrow::Cow::Owned(out))
    }

    pub fn detections(&self, port: usize) -> Result<&[Detection], StepError> {
        self.get::<[Detection]>(port)
    }
}

/// A runnable step. `run` is called once per frame, possibly from any worker thread; a stateful
/// step is never called for two frames of one source at once.
pub trait Step: Send + Sync + fmt::Debug {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError>;

    /// Forgets what the step keeps for `source` (a tracker's tracks, a counter's totals, a
    /// background model), so that the source's next frame starts afresh. The executor calls it
    /// after the step panicked on a frame of that source, when that state may be half updated,
    /// before the source's next frame reaches the step. Returns false for a step that keeps
    /// nothing it can forget (the default); a stateful kind returns true, state or none.
    fn reset_source(&self, _source: &str) -> bool {
        false
    }

    /// The frames of `source` changed size, from `from` to `to` (a camera reconfigured or back
    /// at another size, a file whose caps change). The executor calls it for a stateful step
    /// just before the step's first run on a frame of the new size, on the thread that runs
    /// it, between two frames of the source (like [`Step::reset_source`]). A step whose state
    /// for the source is in pixels restarts it (totals are kept) and returns what the change
    /// means for it, which the executor logs at warning with the step's name; `None` (the
    /// default): nothing it keeps depends on the size.
    fn source_resized(&self, _source: &str, _from: Format, _to: Format) -> Option<String> {
        None
    }

    /// The width and height of every image on the step's `image` output, when its parameters
    /// fix them (`crop`, `resize`): validation tells a sink that records them what it will do
    /// with that size. `None` (the default): the size depends on the frames.
    fn image_size(&self) -> Option<(u32, u32)> {
        None
    }

    /// How the image on the step's `image` output lies on its `image` input, for whoever shows
    /// boxes found in it over the frame ([`Place`]). The default: the same pixels.
    fn placement(&self) -> Placement {
        Placement::Same
    }

    /// The lines and zones the step tests boxes against (`line_counter`, `zone_count`), for
    /// the live page to draw beside the boxes. Empty (the default): none.
    fn shapes(&self) -> Vec<Shape> {
        Vec::new()
    }
}

/// A line or a zone, in the pixels of the image the boxes were found in (x right, y down).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// As the step's counts and events name it.
    pub name: Arc<str>,
    /// A zone's polygon closes (its last point joins the first); a line's segment does not.
    pub zone: bool,
    pub points: Vec<[f32; 2]>,
}

/// What a step made of a frame.
#[derive(Debug)]
pub enum StepOutput {
    /// One value per output port, in port order.
    Values(Vec<Value>),
    /// Nothing for this frame: the steps that read this one are skipped (not failed).
    EndBranch,
}

/// Why a step failed on a frame.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("opencv: {0}")]
    OpenCv(#[from] opencv::Error),
    #[error("input {0} is not {1}")]
    Input(usize, ValueType),
    #[error("frame: {0}")]
    Frame(crate::frame::FrameError),
    #[error("panicked: {0}")]
    Panic(String),
    #[error("{0}")]
    Other(String),
}

const IMAGE_IN: &[Port] = &[Port {
    name: "image",
    ty: ValueType::Image,
    optional: false,
}];
const IMAGE_OUT: &[Port] = IMAGE_IN;
const DETECTIONS_OUT: &[Port] = &[Port {
    name: "detections",
    ty: ValueType::Detections,
    optional: false,
}];
