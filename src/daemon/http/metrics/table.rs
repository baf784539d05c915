//! The table of `/metrics`: every metric's name, type and help, and how its samples are read
//! (written by [`super::render`]).

use std::sync::atomic::AtomicU64;

use crate::daemon::feed::Feed;
use crate::packets::RecordStats;
use crate::packets::video::Video;
use crate::sinks::preview::hub;
use crate::sinks::{SinkSender, SinkStats};
use crate::source::SourceCounters;
use crate::storage::{FilesystemReport, SinkTotals};
use crate::workflow::{ExecutorMetrics, PoolMetrics, StepMetrics};

/// One metric of `/metrics`: its name, type and help, and how its samples are read.
pub(super) struct Metric {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    pub read: Read,
}

/// How a metric's samples are read from the run's state (`State`), each labelled by what it
/// is read from. A metric of a part the run does not have (no executor, no pool, no storage, a
/// `/proc` it cannot read) is left out, header and all.
pub(super) enum Read {
    /// Per source, from its counters.
    Source(fn(&SourceCounters) -> &AtomicU64),
    /// Per source and state: 1 for the state it is in.
    SourceState,
    /// Per source, seconds since its last frame (no sample before the first).
    SourceAge,
    /// Per source, its camera's clock skew in seconds (no sample before a sender report).
    SourceClockSkew,
    /// Per source, from the preview's hub.
    Preview(fn(&str) -> u64),
    /// Per source, its live video's (`/api/video`, `crate::packets::video`).
    Video(fn(&Video) -> &AtomicU64),
    /// Per recorded source and state of its record stream: 1 for the state it is in.
    RecordState,
    /// Per recorded source, from its record stream's counters.
    RecordStream(fn(&SourceCounters) -> &AtomicU64),
    /// Per `record` sink and source (`crate::packets`).
    RecordSink(fn(&RecordStats) -> &AtomicU64),
    /// Per `record` sink, source and bound of a packets clip's ring: the packets it dropped.
    RecordRingDropped,
    /// Per step.
    Step(fn(&StepMetrics) -> &AtomicU64),
    /// Per step, the histogram of its run times.
    StepDuration,
    Executor(fn(&ExecutorMetrics) -> &AtomicU64),
    Pool(fn(&PoolMetrics) -> &AtomicU64),
    /// Per sink, from its counts and its queue.
    Sink(fn(&SinkStats, &SinkSender) -> u64),
    /// Per sink, from the storage's counts.
    StorageSink(fn(&SinkTotals) -> u64),
    /// Per filesystem written to, labelled by its first folder.
    Filesystem(fn(&FilesystemReport) -> u64),
    /// The run's frames delivered, and failed.
    Delivered(fn((u64, u64)) -> u64),
    /// The live stream's (`/api/live`).
    Feed(fn(&Feed) -> &AtomicU64),
    /// 1 for the phase the run is in.
    Phase,
    CpuSeconds,
    ResidentBytes,
}

/// Every metric, in the order `/metrics` writes them (docs/reference/metrics.md lists them).
pub(super) static METRICS: &[Metric] = &[
    Metric {
        name: "vidflow_source_frames_decoded_total",
        kind: "counter",
        help: "Frames decoded and accepted.",
        read: Read::Source(|c| &c.decoded),
    },
    Metric {
        name: "vidflow_source_frames_dropped_total",
        kind: "counter",
        help: "Decoded frames that never reached the workflow (queue overflow, hard stop).",
        read: Read::Source(|c| &c.dropped),
    },
    Metric {
        name: "vidflow_source_frames_throttled_total",
        kind: "counter",
        help: "Frames discarded by max_fps before conversion.",
        read: Read::Source(|c| &c.throttled),
    },
    Metric {
        name: "vidflow_source_frames_copied_total",
        kind: "counter",
        help: "Frames copied out of the decoder's buffer because its small pool could spare no \
               more.",
        read: Read::Source(|c| &c.copied),
    },
    Metric {
        name: "vidflow_source_reconnects_total",
        kind: "counter",
        help: "Times the stream came back after a loss.",
        read: Read::Source(|c| &c.reconnects),
    },
    Metric {
        name: "vidflow_source_size_changes_total",
        kind: "counter",
        help: "Times the source's frames changed size or frame rate (a camera reconfigured or \
               back at another size).",
        read: Read::Source(|c| &c.size_changes),
    },
    Metric {
        name: "vidflow_source_state",
        kind: "gauge",
        help: "1 for the state the source is in (connecting, streaming, retrying, stalled, \
               ended).",
        read: Read::SourceState,
    },
    Metric {
        name: "vidflow_source_seconds_since_last_frame",
        kind: "gauge",
        help: "Seconds since the source's last frame (absent before the first).",
        read: Read::SourceAge,
    },
    Metric {
        name: "vidflow_source_clock_skew_seconds",
        kind: "gauge",
        help: "The camera's clock minus this computer's at its latest RTCP sender report \
               (absent before one); past 2 s its events are placed by their arrival.",
        read: Read::SourceClockSkew,
    },
    Metric {
        name: "vidflow_preview_jpegs_total",
        kind: "counter",
        help: "JPEGs encoded for the live preview (only while someone watches).",
        read: Read::Preview(|source| hub().encodes(source)),
    },
    Metric {
        name: "vidflow_preview_watchers",
        kind: "gauge",
        help: "Preview streams (/preview/SOURCE) open now, plus 1 while the live stream sends \
               the source's stills.",
        read: Read::Preview(|source| u64::try_from(hub().watchers(source)).unwrap_or(u64::MAX)),
    },
    Metric {
        name: "vidflow_record_stream_state",
        kind: "gauge",
        help: "1 for the state the source's record stream is in (record_uri, else uri).",
        read: Read::RecordState,
    },
    Metric {
        name: "vidflow_record_stream_reconnects_total",
        kind: "counter",
        help: "Times the record stream came back after a loss.",
        read: Read::RecordStream(|c| &c.reconnects),
    },
    Metric {
        name: "vidflow_record_stream_packets_total",
        kind: "counter",
        help: "Encoded frames the record stream gave.",
        read: Read::RecordStream(|c| &c.decoded),
    },
    Metric {
        name: "vidflow_record_bytes_total",
        kind: "counter",
        help: "Bytes of the camera's stream a record sink (or a packets clip, in finished \
               clips) wrote.",
        read: Read::RecordSink(|s| &s.bytes),
    },
    Metric {
        name: "vidflow_record_segments_total",
        kind: "counter",
        help: "Segments a record sink started (for a packets clip: clips finished).",
        read: Read::RecordSink(|s| &s.segments),
    },
    Metric {
        name: "vidflow_record_gaps_total",
        kind: "counter",
        help: "Breaks in a recording: a lost stream, packets lost to a full queue, a failed \
               write.",
        read: Read::RecordSink(|s| &s.gaps),
    },
    Metric {
        name: "vidflow_record_ring_dropped_packets_total",
        kind: "counter",
        help: "Packets a packets clip's ring dropped past a bound: bytes (sized from the \
               pre-roll and the stream's bitrate, vidflow_record_ring_limit_bytes) or duration \
               (the pre-roll + 60 s, vidflow_record_ring_limit_ms: the record stream far ahead \
               of the decoded stream).",
        read: Read::RecordRingDropped,
    },
    Metric {
        name: "vidflow_record_ring_limit_bytes",
        kind: "gauge",
        help: "A packets clip's ring's byte bound now: the stream's measured bitrate x \
               (pre-roll + 60 s) x 1.5, within 64 MiB and 256 MiB.",
        read: Read::RecordSink(|s| &s.ring_limit_bytes),
    },
    Metric {
        name: "vidflow_record_ring_limit_ms",
        kind: "gauge",
        help: "A packets clip's ring's duration bound: the pre-roll + 60 s.",
        read: Read::RecordSink(|s| &s.ring_limit_ms),
    },
    Metric {
        name: "vidflow_record_keyframes_total",
        kind: "counter",
        help: "Keyframes the camera sent to a record sink or a packets clip.",
        read: Read::RecordSink(|s| &s.keyframes),
    },
    Metric {
        name: "vidflow_record_keyframe_interval_ms",
        kind: "gauge",
        help: "Time between the camera's last two keyframes.",
        read: Read::RecordSink(|s| &s.keyframe_interval_ms),
    },
    Metric {
        name: "vidflow_step_runs_total",
        kind: "counter",
        help: "Times the step ran (skips are not counted).",
        read: Read::Step(|s| &s.runs),
    },
    Metric {
        name: "vidflow_step_failures_total",
        kind: "counter",
        help: "Runs of the step that failed.",
        read: Read::Step(|s| &s.failures),
    },
    Metric {
        name: "vidflow_step_state_resets_total",
        kind: "counter",
        help: "Panics of the step after which its state for the frame's source was reset.",
        read: Read::Step(|s| &s.state_resets),
    },
    Metric {
        name: "vidflow_step_duration_seconds",
        kind: "histogram",
        help: "Time in the step per run.",
        read: Read::StepDuration,
    },
    Metric {
        name: "vidflow_executor_frames_in_flight",
        kind: "gauge",
        help: "Frames admitted to the workflow and not yet delivered.",
        read: Read::Executor(|e| &e.in_flight),
    },
    Metric {
        name: "vidflow_executor_wakeups_total",
        kind: "counter",
        help: "Wake-ups of the executor's coordinator.",
        read: Read::Executor(|e| &e.coordinator_wakeups),
    },
    Metric {
        name: "vidflow_pool_dispatches_total",
        kind: "counter",
        help: "Steps queued on the worker pool.",
        read: Read::Pool(|p| &p.dispatches),
    },
    Metric {
        name: "vidflow_pool_wakeups_total",
        kind: "counter",
        help: "Worker wake-ups from an idle wait.",
        read: Read::Pool(|p| &p.wakeups),
    },
    Metric {
        name: "vidflow_sink_written_total",
        kind: "counter",
        help: "Frames the sink wrote.",
        read: Read::Sink(|stats, _| stats.written),
    },
    Metric {
        name: "vidflow_sink_skipped_total",
        kind: "counter",
        help: "Frames with nothing for the sink.",
        read: Read::Sink(|stats, _| stats.skipped),
    },
    Metric {
        name: "vidflow_sink_dropped_total",
        kind: "counter",
        help: "Frames the sink lost (failed writes, a full queue).",
        read: Read::Sink(|stats, _| stats.dropped),
    },
    Metric {
        name: "vidflow_sink_queue_depth",
        kind: "gauge",
        help: "Results waiting in the sink's queue.",
        read: Read::Sink(|_, sender| sender.queue_len() as u64),
    },
    Metric {
        name: "vidflow_storage_kept_bytes",
        kind: "gauge",
        help: "Bytes of the sink's files kept.",
        read: Read::StorageSink(|t| t.kept_bytes),
    },
    Metric {
        name: "vidflow_storage_kept_files",
        kind: "gauge",
        help: "Files of the sink kept.",
        read: Read::StorageSink(|t| t.kept_files),
    },
    Metric {
        name: "vidflow_storage_purged_bytes_total",
        kind: "counter",
        help: "Bytes of the sink's files deleted by retention.",
        read: Read::StorageSink(|t| t.purged_bytes),
    },
    Metric {
        name: "vidflow_storage_purged_files_total",
        kind: "counter",
        help: "Files of the sink deleted by retention.",
        read: Read::StorageSink(|t| t.purged_files),
    },
    Metric {
        name: "vidflow_storage_disk_full_total",
        kind: "counter",
        help: "Writes of the sink that found their filesystem full.",
        read: Read::StorageSink(|t| t.disk_full),
    },
    Metric {
        name: "vidflow_storage_undeletable_total",
        kind: "counter",
        help: "Deletes of the sink's files that failed (the file is kept and counted, tried \
               again later).",
        read: Read::StorageSink(|t| t.undeletable),
    },
    Metric {
        name: "vidflow_storage_free_bytes",
        kind: "gauge",
        help: "Free bytes of a filesystem vidflow writes to (labelled by its first folder).",
        read: Read::Filesystem(|fs| fs.free_bytes),
    },
    Metric {
        name: "vidflow_storage_size_bytes",
        kind: "gauge",
        help: "Size of a filesystem vidflow writes to.",
        read: Read::Filesystem(|fs| fs.size_bytes),
    },
    Metric {
        name: "vidflow_frames_delivered_total",
        kind: "counter",
        help: "Frames delivered to the sinks (processed or failed).",
        read: Read::Delivered(|(delivered, _)| delivered),
    },
    Metric {
        name: "vidflow_frames_failed_total",
        kind: "counter",
        help: "Delivered frames with a failed step.",
        read: Read::Delivered(|(_, failed)| failed),
    },
    Metric {
        name: "vidflow_live_frames_dropped_total",
        kind: "counter",
        help: "Frames the live stream (/api/live) did not carry: its thread was behind.",
        read: Read::Feed(|f| &f.dropped),
    },
    Metric {
        name: "vidflow_live_slow_clients_total",
        kind: "counter",
        help: "Live stream clients closed: they read slower than frames came.",
        read: Read::Feed(|f| &f.slow_clients),
    },
    Metric {
        name: "vidflow_live_stills_dropped_total",
        kind: "counter",
        help: "Cameras' stills (/api/live?stills=1) replaced by a newer one before a client \
               took them.",
        read: Read::Feed(|f| &f.stills_dropped),
    },
    Metric {
        name: "vidflow_video_viewers",
        kind: "gauge",
        help: "Viewers of the source's live video (/api/video/SOURCE) now.",
        read: Read::Video(|v| &v.viewers),
    },
    Metric {
        name: "vidflow_video_queued_bytes",
        kind: "gauge",
        help: "Bytes of live video (/api/video/SOURCE) waiting for its viewers now, summed over \
               them; each viewer's are bounded (past 12 MiB it is skipped to the next keyframe).",
        read: Read::Video(|v| &v.queued_bytes),
    },
    Metric {
        name: "vidflow_video_bytes_sent_total",
        kind: "counter",
        help: "Bytes of live video (/api/video/SOURCE) written to its viewers.",
        read: Read::Video(|v| &v.bytes_sent),
    },
    Metric {
        name: "vidflow_video_skips_total",
        kind: "counter",
        help: "Times a live video viewer fell behind and was moved to the next keyframe.",
        read: Read::Video(|v| &v.skips),
    },
    Metric {
        name: "vidflow_video_lost_total",
        kind: "counter",
        help: "Times the live video thread fell behind its source and skipped to its next \
               keyframe.",
        read: Read::Video(|v| &v.lost),
    },
    Metric {
        name: "vidflow_video_encoders",
        kind: "gauge",
        help: "Encoders running for the source's live video (a source with no H.264 of its \
               own, while watched): 0 or 1.",
        read: Read::Video(|v| &v.encoders),
    },
    Metric {
        name: "vidflow_video_frames_encoded_total",
        kind: "counter",
        help: "Frames of the source encoded for its live video.",
        read: Read::Video(|v| &v.encoded),
    },
    Metric {
        name: "vidflow_video_frames_dropped_total",
        kind: "counter",
        help: "Frames of the source missing from its live video: its encoder was behind.",
        read: Read::Video(|v| &v.encode_dropped),
    },
    Metric {
        name: "vidflow_phase",
        kind: "gauge",
        help: "1 for the phase the run is in.",
        read: Read::Phase,
    },
    Metric {
        name: "process_cpu_seconds_total",
        kind: "counter",
        help: "User and system CPU time, in seconds.",
        read: Read::CpuSeconds,
    },
    Metric {
        name: "process_resident_memory_bytes",
        kind: "gauge",
        help: "Resident memory, in bytes.",
        read: Read::ResidentBytes,
    },
];
