//! Sink kinds: where results go. Each sink runs on its own thread (see [`common::runner`]).

use std::fmt;

use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::storage::Storage;
use crate::value::ValueType;

mod clip;
mod common;
mod jsonl;
mod mqtt;
mod nats;
pub mod preview;
mod record;
mod redis_stream;
mod snapshot;
mod video_file;
mod webhook;

pub use common::runner::{Closing, OnFull, Routing, SinkRunner, SinkSender, SinkStats};

/// Every sink kind, in the order `vidflow steps` lists them.
pub static KINDS: &[&SinkKind] = &[
    &jsonl::KIND,
    &video_file::KIND,
    &record::KIND,
    &snapshot::KIND,
    &clip::KIND,
    &mqtt::KIND,
    &nats::KIND,
    &redis_stream::KIND,
    &webhook::KIND,
    &preview::KIND,
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
    /// A key and value of the sink's table with which this single input may be left out (the
    /// kind then reads none: `clip`'s `image` with `mode = "packets"`); `None`: required.
    pub optional_with: Option<(&'static str, &'static str)>,
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
    /// Opens the sink; a sink that writes files indexes them in `storage` (which keeps them
    /// by its retention).
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &Storage,
    ) -> Result<Box<dyn Sink>, SinkError>;

    /// What delivery does when this sink's queue is full, unless the file says `on_full`:
    /// files wait (nothing lost), network sinks should drop their oldest.
    fn default_on_full(&self) -> OnFull {
        OnFull::Block
    }

    /// `Some(problem)` if this sink would mix the frames of several sources in one output
    /// (a video path without `{source}`): validation reports it when the sink takes more than
    /// one source.
    fn single_source(&self) -> Option<Diagnostic> {
        None
    }

    /// What the sink does with the images on its `image` input when validation knows their
    /// size in advance (a `crop` or `resize` makes them): `Ok(Some(note))`, recorded but not
    /// as they are (said by `validate`, not a problem); `Err(problem)`, they cannot be
    /// recorded. `Ok(None)` (the default): nothing to say.
    fn images_of(&self, _width: u32, _height: u32) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// For a sink that writes the encoded packets of its sources as the camera sent them
    /// (`record`, `clip` in packet mode): told once, at resolution, which sources it takes
    /// (each then opens its record stream, `crate::packets`); says whether it takes packets.
    /// The default takes none.
    fn takes_packets(&mut self, _sources: &[std::sync::Arc<str>]) -> bool {
        false
    }
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
    /// When the sink wants [`Sink::idle`] called again if no frame comes first (a periodic
    /// fsync, say); `None`: only when a frame has been written.
    fn wake_at(&self) -> Option<std::time::Instant> {
        None
    }
    /// For a sink that writes behind [`Sink::write`] (an encoder, a muxer): the count of frames
    /// it took (`Ok(true)`) and lost afterwards, before they reached a finished output (an
    /// encoder that failed with frames in it, a segment that was not finalized). The runner
    /// asks once, reads it whenever it reports counts (also after [`Sink::close`]), and moves
    /// them from `written` to `dropped`. `None` (the default): what `write` took is written.
    fn lost_after_write(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        None
    }
    /// Finalizes the output (flush, trailer, ...).
    fn close(self: Box<Self>) -> Result<(), SinkError>;
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{}: {}", path.display(), io_reason(path, source))]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: gstreamer: {message}", path.display())]
    Gstreamer {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{}: disk full; frames are lost until there is room", path.display())]
    DiskFull { path: std::path::PathBuf },
    #[error("{0}")]
    Other(String),
}

/// `retain_days` of a sink that writes files.
const RETAIN_DAYS_DOC: ParamDoc = ParamDoc {
    name: "retain_days",
    ty: "float in (0, 36525]",
    default: "forever",
    doc: "files older than this are deleted (only files this sink wrote, never one being written)",
};

/// `max_gb` of a sink that writes files.
const MAX_GB_DOC: ParamDoc = ParamDoc {
    name: "max_gb",
    ty: "float > 0",
    default: "no cap",
    doc: "the sink's files are kept under this many GB, the oldest deleted first",
};

/// The image a `snapshot` or `clip` records.
const IMAGE_PORT: SinkPort = SinkPort {
    name: "image",
    ty: Some(ValueType::Image),
    list: false,
    optional_with: None,
};

/// The values a sink that sends each frame's JSON puts in it (`jsonl`, `mqtt`, `webhook`,
/// `nats`, `redis_stream`): any type, any number.
const INCLUDE_PORT: SinkPort = SinkPort {
    name: "include",
    ty: None,
    list: true,
    optional_with: None,
};

/// What triggers a `snapshot` or `clip`: any of these values non-empty.
const WHEN_PORT: SinkPort = SinkPort {
    name: "when",
    ty: None,
    list: true,
    optional_with: None,
};

/// Whether any of `refs` has a value on this frame that is not empty (a detection, a track, an
/// event: [`crate::value::Value::is_empty`]).
fn any_non_empty(result: &FrameResult, refs: impl IntoIterator<Item = crate::spec::Ref>) -> bool {
    refs.into_iter()
        .any(|r| result.value(r).is_some_and(|v| !v.is_empty()))
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

/// Creates the parent folder of an output file. An error names the file, so that a folder on
/// its way that is a file is named as such ([`io_reason`]).
fn create_parent(path: &std::path::Path) -> Result<(), SinkError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
                path: path.to_owned(),
                source,
            })
        }
        _ => Ok(()),
    }
}

/// Why a file could not be made at `path`, in words: the system's error says "File exists"
/// when a folder on the way is a file, and "No such file or directory" under /proc.
fn io_reason(path: &std::path::Path, error: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    if !matches!(
        error.kind(),
        K::AlreadyExists | K::NotADirectory | K::NotFound
    ) {
        return error.to_string();
    }
    // The nearest folder on the way that exists (relative paths: up to the working directory).
    let existing = path
        .ancestors()
        .skip(1)
        .find(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_ok());
    let Some(existing) = existing else {
        return error.to_string();
    };
    match std::fs::metadata(existing) {
        Ok(m) if !m.is_dir() => format!(
            "\"{}\" is a file, not a folder ({error})",
            existing.display()
        ),
        Ok(_) if error.kind() == K::NotFound => match kernel_filesystem(existing) {
            Some(kind) => format!(
                "\"{}\" is the kernel's {kind} filesystem, where no file can be created \
                 ({error})",
                existing.display()
            ),
            None => error.to_string(),
        },
        _ => error.to_string(),
    }
}

/// The name of the kernel's own filesystem `dir` is on (proc, sysfs, ...), if it is one.
fn kernel_filesystem(dir: &std::path::Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value of that plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `fs` is writable; both outlive the call.
    if unsafe { libc::statfs(c_path.as_ptr(), &raw mut fs) } != 0 {
        return None;
    }
    // Magic numbers of linux/magic.h.
    #[allow(
        clippy::useless_conversion,
        reason = "f_type is i64 on x86-64, u32 on other targets: widened, never cut"
    )]
    let magic = i64::from(fs.f_type);
    Some(match magic {
        0x9fa0 => "proc",
        0x6265_6572 => "sysfs",
        0x1cd1 => "devpts",
        0x0027_e0eb | 0x6367_7270 => "cgroup",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0x7363_6673 => "securityfs",
        0x6265_6570 => "configfs",
        0xcafe_4a11 => "bpf",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factory a kind builds from `params` (its keys, without `kind` and inputs).
    fn factory(kind: &str, params: &str) -> Box<dyn SinkFactory> {
        let kind = self::kind(kind).unwrap();
        (kind.build)(Params::from_toml(params)).unwrap()
    }

    #[test]
    fn files_wait_when_their_queue_is_full_and_network_sinks_drop_their_oldest() {
        let jsonl = factory("jsonl", "path = \"out/x.jsonl\"");
        assert_eq!(jsonl.default_on_full(), OnFull::Block);
        let mqtt = factory("mqtt", "url = \"mqtt://127.0.0.1:1\"");
        assert_eq!(mqtt.default_on_full(), OnFull::DropOldest);
        let webhook = factory("webhook", "url = \"http://127.0.0.1:1/hook\"");
        assert_eq!(webhook.default_on_full(), OnFull::DropOldest);
        let nats = factory("nats", "url = \"nats://127.0.0.1:1\"");
        assert_eq!(nats.default_on_full(), OnFull::DropOldest);
        let redis = factory("redis_stream", "url = \"redis://127.0.0.1:1\"");
        assert_eq!(redis.default_on_full(), OnFull::DropOldest);
    }
}
