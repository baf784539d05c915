//! One source of a `record` sink: its thread takes the source's packets and writes them into
//! segments (see the parent module for the threads and the stop protocol).
//!
//! A segment starts on a keyframe: packets before the first one of a connection are left out
//! (they would not decode). A new connection of the record stream (after a loss) or new caps
//! (the camera reconfigured) close the segment being written and start another at the next
//! keyframe; each pipeline's timestamps start at zero (the record stream's start again at
//! each connection). A segment whose write fails is closed and counted a gap; the next
//! keyframe starts a new one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use gstreamer as gst;

use crate::packets::{Carried, KeyframeCounter, Packet, RecordStats, Subscription, Timeline};
use crate::sinks::SinkError;
use crate::sinks::video_file::encoder::{Muxing, Segments};
use crate::storage::SinkFiles;

/// The thread writing one source.
pub(super) struct Writer {
    stop: Sender<()>,
    thread: JoinHandle<Result<(), SinkError>>,
}

/// What the thread owns.
struct Work {
    source: Arc<str>,
    segments: Segments,
    files: SinkFiles,
    stats: Arc<RecordStats>,
    /// Packets this sink took that are in no finished segment (a write that failed).
    lost: Arc<AtomicU64>,
    /// The segment pipeline running now.
    current: Option<Current>,
    /// Segments named by the pipelines closed already.
    segments_before: u64,
    keyframes: KeyframeCounter,
    first_error: Option<SinkError>,
}

/// A segment pipeline and what its packets are measured against.
struct Current {
    muxing: Muxing,
    connection: u64,
    caps: gst::Caps,
    timeline: Timeline,
}

impl Writer {
    pub(super) fn spawn(
        sink: &str,
        source: &Arc<str>,
        segments: Segments,
        files: SinkFiles,
    ) -> Result<Self, SinkError> {
        let subscription = crate::packets::hub().subscribe(source);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let work = Work {
            source: source.clone(),
            segments,
            files,
            stats: crate::packets::hub().record_stats(sink, source),
            lost: Arc::default(),
            current: None,
            segments_before: 0,
            keyframes: KeyframeCounter::default(),
            first_error: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-rec-{source}"))
            .spawn(move || work.run(&subscription, &stopped))
            .map_err(|e| SinkError::Other(format!("record: cannot spawn a thread: {e}")))?;
        Ok(Self { stop, thread })
    }

    /// Stops the thread once it has written what is queued; its first error, if any.
    pub(super) fn close(self) -> Result<(), SinkError> {
        drop(self.stop);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(SinkError::Other("record: its thread panicked".to_owned())))
    }
}

impl Work {
    fn run(mut self, subscription: &Subscription, stopped: &Receiver<()>) -> Result<(), SinkError> {
        let packets = &subscription.packets;
        loop {
            crossbeam_channel::select! {
                recv(packets) -> item => match item {
                    Ok(item) => self.take(item),
                    Err(_) => break,
                },
                recv(stopped) -> _ => {
                    for item in packets.try_iter() {
                        self.take(item);
                    }
                    break;
                }
            }
        }
        self.finish_segment();
        let overflows = subscription.overflows.load(Ordering::Relaxed);
        self.stats.gaps.fetch_add(overflows, Ordering::Relaxed);
        match self.first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn take(&mut self, item: Carried) {
        match item {
            Carried::Break => {
                if self.current.is_some() {
                    self.finish_segment();
                    self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                }
            }
            Carried::Packet(packet) => self.packet(&packet),
        }
    }

    fn packet(&mut self, packet: &Packet) {
        let keyframe = packet.keyframe();
        if let Some(c) = &self.current
            && (c.connection != packet.connection || c.caps != packet.caps)
        {
            if c.connection != packet.connection {
                self.stats.gaps.fetch_add(1, Ordering::Relaxed);
            }
            self.finish_segment();
        }
        if keyframe {
            self.keyframes.count(&self.stats, packet);
        }
        if self.current.is_none() {
            if !keyframe {
                return;
            }
            match self.start(packet) {
                Ok(c) => self.current = Some(c),
                Err(e) => return self.failed(e),
            }
        }
        let Some(current) = &mut self.current else {
            return;
        };
        let buffer = current.timeline.place(packet);
        let size = u64::try_from(buffer.size()).unwrap_or(u64::MAX);
        match current.muxing.push(buffer) {
            Ok(()) => {
                self.files.wrote();
                self.stats.packets.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(size, Ordering::Relaxed);
                let named = self.segments_before + current.muxing.segments();
                self.stats.segments.store(named, Ordering::Relaxed);
            }
            Err(e) => {
                self.finish_segment();
                self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                self.failed(e);
            }
        }
    }

    /// Starts a segment pipeline for the stream `first` (a keyframe) begins.
    fn start(&self, first: &Packet) -> Result<Current, SinkError> {
        let parser = first.parser().map_err(|other| {
            SinkError::Other(format!(
                "record: source \"{}\" sends {other}, which cannot be recorded (H.264 or \
                 H.265 only)",
                self.source
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
            connection: first.connection,
            caps: first.caps.clone(),
            timeline: Timeline::starting_at(first),
        })
    }

    /// Finalizes the segment being written, if any.
    fn finish_segment(&mut self) {
        let Some(current) = self.current.take() else {
            return;
        };
        self.segments_before += current.muxing.segments();
        if let Err(e) = current.muxing.close() {
            self.failed(e);
        }
    }

    fn failed(&mut self, e: SinkError) {
        tracing::warn!(source = %self.source, error = %e, "record: a segment failed; a new one starts at the next keyframe");
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}
