//! `jsonl`: one JSON object per frame, one frame per line, appended (never truncated).
//!
//! See [`file`] for how lines reach the disk: whole lines only, repair of a partial last line,
//! fsync and rotation. Runs on the sink's thread (`runner`); no thread of its own.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use toml::Spanned;

use crate::storage::{Class, FilePolicy, Retention};

use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};

mod file;

use file::{Files, Fsync, Rotation};

pub(super) static KIND: SinkKind = SinkKind {
    name: "jsonl",
    summary: "one JSON line per frame: source, frame, pts_ms, time, the included values and the error if any",
    inputs: &[super::INCLUDE_PORT],
    params: &[
        ParamDoc {
            name: "path",
            ty: "path",
            default: "required",
            doc: "file to append to (created with its folder; a partial last line left by a crash \
                  is cut off); {source} gives one file per source, {date} the UTC date",
        },
        ParamDoc {
            name: "fsync",
            ty: "\"never\" | \"interval\" | \"always\"",
            default: "\"interval\"",
            doc: "force lines to disk: never, within a second of writing them, or after each",
        },
        ParamDoc {
            name: "rotate_mb",
            ty: "integer in [1, 1048576]",
            default: "none",
            doc: "start a new file (name.1.jsonl, name.2.jsonl, ...) once a file reaches this size",
        },
        ParamDoc {
            name: "rotate_hours",
            ty: "float > 0",
            default: "none",
            doc: "start a new file once a file has been written to for this long",
        },
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: Spanned<String>,
    fsync: Option<Spanned<String>>,
    rotate_mb: Option<Spanned<u64>>,
    rotate_hours: Option<Spanned<f64>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

/// The largest `rotate_mb`: a terabyte.
const MAX_ROTATE_MB: u64 = 1 << 20;

#[derive(Debug)]
struct Factory {
    rotation: Rotation,
    policy: FilePolicy,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let fsync = match c.fsync.as_ref().map(|f| (f.get_ref().as_str(), f.span())) {
        None | Some(("interval", _)) => Fsync::Interval,
        Some(("never", _)) => Fsync::Never,
        Some(("always", _)) => Fsync::Always,
        Some((other, span)) => {
            return Err(Diagnostic::at(
                span,
                format!("fsync must be \"never\", \"interval\" or \"always\", not \"{other}\""),
            ));
        }
    };
    let max_bytes = match c.rotate_mb {
        Some(mb) if !(1..=MAX_ROTATE_MB).contains(mb.get_ref()) => {
            return Err(Diagnostic::at(
                mb.span(),
                format!("rotate_mb must be between 1 and {MAX_ROTATE_MB}"),
            ));
        }
        Some(mb) => Some(mb.into_inner() << 20),
        None => None,
    };
    let max_age = match c.rotate_hours {
        Some(h) => match Duration::try_from_secs_f64(h.get_ref() * 3600.0) {
            Ok(d) if d >= Duration::from_secs(1) => Some(d),
            _ => {
                return Err(Diagnostic::at(
                    h.span(),
                    format!(
                        "rotate_hours must be a positive number of hours, not {}",
                        h.get_ref()
                    ),
                ));
            }
        },
        None => None,
    };
    if c.path.get_ref().trim().is_empty() {
        return Err(Diagnostic::at(c.path.span(), "path is empty"));
    }
    let rotates = max_bytes.is_some() || max_age.is_some() || c.path.get_ref().contains("{date}");
    let retention_span = c
        .retain_days
        .as_ref()
        .map(Spanned::span)
        .or_else(|| c.max_gb.as_ref().map(Spanned::span));
    if let Some(span) = retention_span.filter(|_| !rotates) {
        return Err(Diagnostic::at(
            span,
            "retention needs files that end: set rotate_mb or rotate_hours, or put {date} in the path",
        ));
    }
    let retention = Retention::parse(
        c.retain_days,
        c.max_gb,
        max_bytes.map(|b| (b, "file at rotate_mb")),
    )?;
    Ok(Box::new(Factory {
        rotation: Rotation {
            template: c.path.into_inner(),
            max_bytes,
            max_age,
            fsync,
        },
        policy: FilePolicy {
            class: Class::Log,
            retention,
            expected_file: max_bytes.unwrap_or(0),
        },
    }))
}

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let mut files =
            Files::new(self.rotation.clone()).indexed_in(storage.sink(name, self.policy));
        // Fail now, not at the first frame, if the file cannot be opened (one without
        // placeholders is the file itself; others are opened at their first line).
        if !self.rotation.per_source() {
            files.open_now()?;
        }
        Ok(Box::new(Jsonl {
            files,
            inputs: inputs.to_vec(),
            line: Vec::new(),
        }))
    }
}

struct Jsonl {
    files: Files,
    inputs: Vec<SinkInput>,
    line: Vec<u8>,
}

/// The JSON object for one frame: its identity, every included value (`null` when its step
/// did not run) and, for a failed frame, the error too: the values computed before the
/// failure are kept.
pub(crate) fn frame_json(result: &FrameResult, inputs: &[SinkInput]) -> Json {
    let frame = result.frame();
    let mut obj = Map::new();
    obj.insert("source".into(), json!(&*frame.source));
    obj.insert("frame".into(), json!(frame.seq));
    obj.insert(
        "pts_ms".into(),
        frame
            .pts
            .map_or(Json::Null, |p| json!(p.as_secs_f64() * 1000.0)),
    );
    obj.insert(
        "time".into(),
        json!(humantime::format_rfc3339_millis(frame.captured).to_string()),
    );
    if let Some(gap) = frame.reconnected {
        obj.insert(
            "reconnected".into(),
            json!({"gap_ms": gap.as_secs_f64() * 1000.0}),
        );
    }
    for input in inputs {
        let value = result.value(input.from).map_or(Json::Null, |v| v.to_json());
        obj.insert(input.label.clone(), value);
    }
    if let Some(failure) = result.failure() {
        obj.insert(
            "error".into(),
            json!({"step": &*failure.step, "message": failure.message}),
        );
    }
    Json::Object(obj)
}

impl Sink for Jsonl {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &frame_json(result, &self.inputs))
            .map_err(|e| SinkError::Other(e.to_string()))?;
        self.line.push(b'\n');
        self.files.write_line(&result.frame().source, &self.line)?;
        Ok(true)
    }

    fn idle(&mut self) -> Result<(), SinkError> {
        self.files.idle()
    }

    fn wake_at(&self) -> Option<std::time::Instant> {
        self.files.wake_at()
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        self.files.close()
    }
}
