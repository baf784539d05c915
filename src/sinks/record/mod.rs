//! `record`: the camera's own encoded stream (H.264 or H.265) written into segments as sent,
//! never decoded nor encoded: the packets of each source's record stream (`record_uri`, else
//! `uri`'s; `crate::packets`), parsed, muxed into fragmented MP4 or Matroska by the same
//! `splitmuxsink` as `video_file` (`video_file::encoder::Muxing`: names that never overwrite,
//! the storage's index and retention, segments that play after a SIGKILL).
//!
//! Threads: one writer thread per source the sink takes (`writer.rs`, on the loop it shares
//! with `clip`'s packets mode: `sinks/common/packet_thread.rs`), blocked on that source's
//! subscription (capacity `packets::SUBSCRIPTION_PACKETS`) and on its stop channel.
//! The runner's thread calls [`Sink::write`] for each decoded frame of those sources: the
//! record sink takes nothing from them (it counts them skipped), so the decoded stream and the
//! recording never wait on each other.
//!
//! Stop protocol: [`Sink::close`] drops the stop channels; each writer takes what is still
//! queued (the sources have stopped by then: their last packets are in), finalizes its
//! segment (bounded by `encoder::CLOSE_TIMEOUT`) and returns; close joins them one by one.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::video_file::encoder::Segments;
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::storage::{Class, FilePolicy, Retention};

mod writer;

pub(super) static KIND: SinkKind = SinkKind {
    name: "record",
    summary: "the camera's own H.264/H.265 stream (record_uri, else uri) in .mp4 or .mkv \
              segments, as sent: never decoded or encoded",
    inputs: &[],
    params: &[
        super::video_file::SEGMENT_PATH_DOC,
        ParamDoc {
            name: "segment_seconds",
            ty: "integer",
            default: "60",
            doc: "length of a segment: each is cut at the camera's first keyframe after it",
        },
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

/// What a second of a recorded camera is taken to weigh, to check `max_gb` against one
/// segment: a 1080p camera at 4 Mbit/s.
const BYTES_PER_SECOND: u64 = 500_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: Spanned<String>,
    segment_seconds: Option<Spanned<u32>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

#[derive(Debug)]
struct Factory {
    segments: Segments,
    policy: FilePolicy,
    /// Reported when the sink takes several sources and the path has no `{source}`.
    mixes_sources: Option<Diagnostic>,
    /// The sources it takes, told at resolution ([`SinkFactory::takes_packets`]).
    sources: Vec<Arc<str>>,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let (mp4, mixes_sources) = super::video_file::segment_path(&c.path)?;
    let seconds = super::video_file::seconds(c.segment_seconds, "segment_seconds", 60)?;
    let segment_bytes = BYTES_PER_SECOND * u64::from(seconds);
    let retention = Retention::parse(
        c.retain_days,
        c.max_gb,
        Some((segment_bytes, "segment of a 4 Mbit/s camera")),
    )?;
    Ok(Box::new(Factory {
        segments: Segments {
            template: c.path.into_inner(),
            source: String::new(),
            mp4,
            segment: Duration::from_secs(seconds.into()),
            // A camera's keyframes come when they come: the cut waits for the next one.
            keyframe_requests: false,
        },
        policy: FilePolicy {
            class: Class::Continuous,
            retention,
            // A camera's bitrate is its own: room for twice the nominal 4 Mbit/s.
            expected_file: segment_bytes * 2,
        },
        mixes_sources,
        sources: Vec::new(),
    }))
}

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        _inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let first = std::path::PathBuf::from(&self.segments.template);
        crate::gst_setup::init().map_err(|message| SinkError::Gstreamer {
            path: first.clone(),
            message,
        })?;
        let files = storage.sink(name, self.policy);
        let mut writers = Vec::new();
        for source in &self.sources {
            let segments = Segments {
                source: source.to_string(),
                ..self.segments.clone()
            };
            let started = writer::spawn(name, source, segments, files.clone());
            match started {
                Ok(w) => writers.push(w),
                Err(e) => {
                    let _ = close_all(writers);
                    return Err(e);
                }
            }
        }
        Ok(Box::new(Record { writers }))
    }

    fn single_source(&self) -> Option<Diagnostic> {
        self.mixes_sources.clone()
    }

    fn takes_packets(&mut self, sources: &[Arc<str>]) -> bool {
        self.sources = sources.to_vec();
        true
    }
}

/// An open `record` sink: its writers, one per source.
struct Record {
    writers: Vec<writer::Writer>,
}

/// Closes every writer; the first error is returned.
fn close_all(writers: Vec<writer::Writer>) -> Result<(), SinkError> {
    let mut first = Ok(());
    for w in writers {
        if let Err(e) = w.close()
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

impl Sink for Record {
    fn write(&mut self, _: &FrameResult) -> Result<bool, SinkError> {
        // The recording comes from the packets, on the writers' threads.
        Ok(false)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        close_all(self.writers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_path_must_be_mp4_or_mkv_and_segments_at_least_a_second() {
        let e = build(Params::from_toml("path = \"r/{source}.avi\"")).unwrap_err();
        assert!(
            e.message.contains("must end in .mp4 or .mkv"),
            "{}",
            e.message
        );
        let e = build(Params::from_toml(
            "path = \"r/{source}.mp4\"\nsegment_seconds = 0",
        ))
        .unwrap_err();
        assert!(
            e.message.contains("segment_seconds must be between 1"),
            "{}",
            e.message
        );
        let mut f = build(Params::from_toml("path = \"r/{source}.mkv\"")).unwrap();
        assert!(f.takes_packets(&["cam".into()]));
        assert!(f.single_source().is_none());
        let one = build(Params::from_toml("path = \"r/all.mkv\"")).unwrap();
        assert!(one.single_source().is_some());
    }
}
