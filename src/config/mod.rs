//! Pipeline files: parsed in two stages.
//!
//! [`raw`] walks the spanned TOML tree close to what the user typed (sections, names, kinds,
//! fixed tables with `deny_unknown_fields`), then [`resolve`] turns it into a runnable
//! [`Pipeline`]: step kinds built, references resolved and type-checked, the step graph checked
//! for cycles. Every stage keeps going after a problem, so one run reports all of them, each
//! with file, line and column.
//!
//! This is the layer that binds kinds: it looks `kind = "..."` up in the step and sink
//! registries and the URI in `source`. What the file is made of (diagnostics, parameters,
//! references) lives below, in [`crate::spec`], so kinds never import this module.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::spec::Diagnostic;

mod events;
mod http;
mod keys;
mod prune;
mod raw;
mod resolve;
mod routing;
mod sizes;
mod source;
mod storage;
mod written;

pub use http::{BasicAuth, HttpConfig, PasswordCheck};
pub use keys::{OTHER_TABLES, SINK_KEYS, SOURCE_TABLES, STEP_KEYS, Table};
pub use prune::pruned_message;
pub use resolve::{
    DEFAULT_STOP_TIMEOUT, DaemonConfig, ExecutorConfig, IN_FLIGHT_PER_WORKER, OnStepError,
    Pipeline, SinkConfig, StepConfig,
};
pub use written::Written;

/// A diagnostic placed in its file: `path:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.path.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// Why a pipeline file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", ProblemList(problems))]
    Invalid { problems: Vec<Problem> },
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// The text of a pipeline file, able to turn byte offsets into line and column.
#[derive(Debug)]
pub struct SourceText {
    pub path: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceText {
    pub fn new(path: impl Into<PathBuf>, text: String) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self {
            path: path.into(),
            text,
            line_starts,
        }
    }

    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::new(path, text))
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    pub fn problem(&self, d: Diagnostic) -> Problem {
        let (line, column) = d.span.map_or((1, 1), |s| self.line_column(s.start));
        Problem {
            path: self.path.clone(),
            line,
            column,
            message: d.message,
        }
    }
}

/// Loads, checks and builds a pipeline file. Every problem in the file is reported at once.
pub fn load(path: &Path) -> Result<Pipeline, ConfigError> {
    let source = SourceText::read(path)?;
    load_text(&source)
}

/// Like [`load`], for text already read.
pub fn load_text(source: &SourceText) -> Result<Pipeline, ConfigError> {
    let (mut diagnostics, mut notes) = (Vec::new(), Vec::new());
    let raw = raw::parse(&source.text, &mut diagnostics);
    let pipeline = raw.map(|raw| resolve::resolve(raw, &mut diagnostics, &mut notes));
    match pipeline {
        Some(p) if diagnostics.is_empty() => Ok(p.with_source(source, notes)),
        _ => {
            diagnostics.sort_by_key(|d| d.span.as_ref().map_or(0, |s| s.start));
            Err(ConfigError::Invalid {
                problems: diagnostics.into_iter().map(|d| source.problem(d)).collect(),
            })
        }
    }
}

/// A component or source name as written in `[steps.NAME]`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

type Name = Arc<str>;
