//! One source of a `record` sink: its thread (`sinks/common/packet_thread.rs`, `vidflow-rec-SOURCE`)
//! takes the source's packets and writes them into segments (see the parent module for the
//! stop protocol).
//!
//! A segment starts on a keyframe: packets before the first one of a connection are left out
//! (they would not decode). A new connection of the record stream (after a loss) or new caps
//! (the camera reconfigured) close the segment being written and start another at the next
//! keyframe; each pipeline's timestamps start at zero (the record stream's start again at
//! each connection). A segment whose write fails is closed and counted a gap; the next
//! keyframe starts a new one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::packets::{Packet, Timeline};
use crate::sinks::SinkError;
use crate::sinks::common::packet_thread::{Common, PacketThread, PacketWork};
use crate::sinks::video_file::encoder::{Muxing, Segments};
use crate::storage::SinkFiles;

/// The thread writing one source.
pub(super) type Writer = PacketThread<()>;

/// Starts the thread writing `source` for the sink `sink`.
pub(super) fn spawn(
    sink: &str,
    source: &Arc<str>,
    segments: Segments,
    files: SinkFiles,
) -> Result<Writer, SinkError> {
    let work = Segmenter {
        segments,
        files,
        lost: Arc::default(),
        current: None,
        segments_before: 0,
        counted: 0,
    };
    PacketThread::spawn(sink, source, work, None)
}

/// What the thread owns.
struct Segmenter {
    segments: Segments,
    files: SinkFiles,
    /// Packets this sink took that are in no finished segment (a write that failed).
    lost: Arc<AtomicU64>,
    /// The segment pipeline running now.
    current: Option<Current>,
    /// Segments named by the pipelines closed already.
    segments_before: u64,
    /// Segments this writer added to its counts.
    counted: u64,
}

/// A segment pipeline and what its packets are measured against.
struct Current {
    muxing: Muxing,
    timeline: Timeline,
}

impl PacketWork for Segmenter {
    type Moment = ();
    const KIND: &'static str = "record";
    const THREAD: &'static str = "rec";
    const FAILED: &'static str = "record: a segment failed; a new one starts at the next keyframe";

    fn packet(&mut self, on: &mut Common, packet: Packet) {
        if self.current.is_none() {
            if !packet.keyframe() {
                return;
            }
            match self.start(on, &packet) {
                Ok(c) => self.current = Some(c),
                Err(e) => return on.failed(e),
            }
        }
        let Some(current) = &mut self.current else {
            return;
        };
        let buffer = current.timeline.place(&packet);
        let size = u64::try_from(buffer.size()).unwrap_or(u64::MAX);
        match current.muxing.push(buffer) {
            Ok(()) => {
                self.files.wrote();
                on.wrote();
                let stats = &on.stats;
                stats.packets.fetch_add(1, Ordering::Relaxed);
                stats.bytes.fetch_add(size, Ordering::Relaxed);
                // Added, never stored: a sink a reload opens again under its name shares
                // its counts, which go on from the old one's.
                let named = self.segments_before + current.muxing.segments();
                stats
                    .segments
                    .fetch_add(named.saturating_sub(self.counted), Ordering::Relaxed);
                self.counted = self.counted.max(named);
            }
            Err(e) => {
                self.finish_segment(on);
                on.gap();
                on.failed(e);
            }
        }
    }

    fn cut(&mut self, on: &mut Common, _fresh: bool) -> bool {
        let open = self.current.is_some();
        self.finish_segment(on);
        open
    }

    fn end(&mut self, on: &mut Common) {
        self.finish_segment(on);
    }
}

impl Segmenter {
    /// Starts a segment pipeline for the stream `first` (a keyframe) begins.
    fn start(&self, on: &Common, first: &Packet) -> Result<Current, SinkError> {
        let parser = first.parser().map_err(|other| {
            SinkError::Other(format!(
                "record: source \"{}\" sends {other}, which cannot be recorded (H.264 or \
                 H.265 only)",
                on.source
            ))
        })?;
        let muxing = Muxing::launch(
            &self.segments,
            parser,
            &first.caps,
            &self.files,
            self.lost.clone(),
        )?;
        Ok(Current {
            muxing,
            timeline: Timeline::starting_at(first),
        })
    }

    /// Finalizes the segment being written, if any.
    fn finish_segment(&mut self, on: &mut Common) {
        let Some(current) = self.current.take() else {
            return;
        };
        self.segments_before += current.muxing.segments();
        if let Err(e) = current.muxing.close() {
            on.failed(e);
        }
    }
}
