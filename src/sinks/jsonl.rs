//! `jsonl`: one JSON object per frame, one frame per line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::{Sink, SinkError, SinkFactory, SinkKind, SinkPort};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};

pub(super) static KIND: SinkKind = SinkKind {
    name: "jsonl",
    summary: "one JSON line per frame: source, frame, pts_ms, time, the included values or the error",
    inputs: &[SinkPort {
        name: "include",
        ty: None,
        list: true,
    }],
    params: &[ParamDoc {
        name: "path",
        ty: "path",
        default: "required",
        doc: "file to write (created, with its folder; truncated)",
    }],
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: PathBuf,
}

#[derive(Debug)]
struct Factory {
    path: PathBuf,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    Ok(Box::new(Factory { path: c.path }))
}

impl SinkFactory for Factory {
    fn open(&self, _name: &str, inputs: &[SinkInput]) -> Result<Box<dyn Sink>, SinkError> {
        super::create_parent(&self.path)?;
        let file = File::create(&self.path).map_err(|source| SinkError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(Box::new(Jsonl {
            path: self.path.clone(),
            out: BufWriter::new(file),
            inputs: inputs.to_vec(),
            line: Vec::new(),
        }))
    }
}

struct Jsonl {
    path: PathBuf,
    out: BufWriter<File>,
    inputs: Vec<SinkInput>,
    line: Vec<u8>,
}

impl Jsonl {
    fn io(&self, source: std::io::Error) -> SinkError {
        SinkError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// The JSON object for one frame.
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
    if let Some(failure) = result.failure() {
        obj.insert(
            "error".into(),
            json!({"step": &*failure.step, "message": failure.message}),
        );
        return Json::Object(obj);
    }
    for input in inputs {
        let value = result.value(input.from).map_or(Json::Null, |v| v.to_json());
        obj.insert(input.label.clone(), value);
    }
    Json::Object(obj)
}

impl Sink for Jsonl {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &frame_json(result, &self.inputs))
            .map_err(|e| SinkError::Other(e.to_string()))?;
        self.line.push(b'\n');
        let line = std::mem::take(&mut self.line);
        let written = self.out.write_all(&line);
        self.line = line;
        written.map_err(|e| self.io(e))?;
        Ok(true)
    }

    fn idle(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|e| self.io(e))
    }

    fn close(mut self: Box<Self>) -> Result<(), SinkError> {
        self.out.flush().map_err(|e| self.io(e))?;
        self.out.get_ref().sync_data().map_err(|e| self.io(e))
    }
}
