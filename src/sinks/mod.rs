//! Sink kinds: where results go. Each sink runs on its own thread (see [`runner`]).

use std::fmt;

use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::value::ValueType;

mod clip;
mod jsonl;
pub mod runner;
mod snapshot;
mod video_file;

pub use runner::{SinkRunner, SinkStats};

/// Every sink kind, in the order `vidflow steps` lists them.
pub static KINDS: &[&SinkKind] = &[
    &jsonl::KIND,
    &video_file::KIND,
    &snapshot::KIND,
    &clip::KIND,
];

pub fn kind(name: &str) -> Option<&'static SinkKind> {
    KINDS.iter().copied().find(|k| k.name == name)
}

/// An input of a sink: one reference, or a list of them (`list`, optional).
#[derive(Debug, Clone, Copy)]
pub struct SinkPort {
    pub name: &'static str,
    /// `None` accepts any type.
    pub ty: Option<ValueType>,
    pub list: bool,
}

pub type BuildSink = fn(Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic>;

#[derive(Debug)]
pub struct SinkKind {
    pub name: &'static str,
    pub summary: &'static str,
    pub inputs: &'static [SinkPort],
    pub params: &'static [ParamDoc],
    pub build: BuildSink,
}

/// A configured sink, opened when the pipeline starts (not when it is validated).
pub trait SinkFactory: Send + Sync + fmt::Debug {
    fn open(&self, name: &str, inputs: &[SinkInput]) -> Result<Box<dyn Sink>, SinkError>;
}

/// An open sink. Called from its own thread only.
pub trait Sink: Send {
    /// Writes one frame's results. `Ok(false)`: nothing to write for this frame (counted as
    /// skipped, e.g. the image it records was not produced).
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError>;
    /// Called when no frame is waiting: a chance to flush.
    fn idle(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// Finalizes the output (flush, trailer, ...).
    fn close(self: Box<Self>) -> Result<(), SinkError>;
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: gstreamer: {message}", path.display())]
    Gstreamer {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{0}")]
    Other(String),
}

/// A frame's time in its source's clock: its timestamp when it has one, else its capture time
/// (so a file processed faster than real time is paced like its scene).
fn source_time(result: &FrameResult) -> std::time::Duration {
    let frame = result.frame();
    frame.pts.unwrap_or_else(|| {
        frame
            .captured
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    })
}

/// `20261201T061500.123Z`: a time in a file name (no `:`).
fn compact_time(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t)
        .to_string()
        .replace(['-', ':'], "")
}

/// Creates the parent folder of an output file.
fn create_parent(path: &std::path::Path) -> Result<(), SinkError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
                path: dir.to_owned(),
                source,
            })
        }
        _ => Ok(()),
    }
}
