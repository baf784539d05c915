//! `/metrics` in Prometheus' text format (version 0.0.4), written by hand, and `/stats.json`
//! for the page. Both read `Live`: atomics, and its parts once per request.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use crate::daemon::Live;
use crate::daemon::live::Phase;
use crate::sinks::preview::hub;
use crate::source::SourceState;
use crate::workflow::LATENCY_BUCKETS_S;

/// The text of `/metrics`.
pub(super) fn render(live: &Live) -> String {
    let parts = live.parts();
    let mut out = Text::default();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);

    let sources = &parts.sources;
    let per_source =
        |out: &mut Text, name: &str, kind: &str, help: &str, value: &dyn Fn(usize) -> u64| {
            out.header(name, kind, help);
            for (i, s) in sources.iter().enumerate() {
                out.sample(name, &[("source", &s.name)], value(i));
            }
        };
    per_source(
        &mut out,
        "vidflow_source_frames_decoded_total",
        "counter",
        "Frames decoded and accepted.",
        &|i| get(&sources[i].counters.decoded),
    );
    per_source(
        &mut out,
        "vidflow_source_frames_dropped_total",
        "counter",
        "Decoded frames that never reached the workflow (queue overflow, hard stop).",
        &|i| get(&sources[i].counters.dropped),
    );
    per_source(
        &mut out,
        "vidflow_source_frames_throttled_total",
        "counter",
        "Frames discarded by max_fps before conversion.",
        &|i| get(&sources[i].counters.throttled),
    );
    per_source(
        &mut out,
        "vidflow_source_frames_copied_total",
        "counter",
        "Frames copied out of the decoder's buffer because its small pool could spare no more.",
        &|i| get(&sources[i].counters.copied),
    );
    per_source(
        &mut out,
        "vidflow_source_reconnects_total",
        "counter",
        "Times the stream came back after a loss.",
        &|i| get(&sources[i].counters.reconnects),
    );
    per_source(
        &mut out,
        "vidflow_source_size_changes_total",
        "counter",
        "Times the source's frames changed size or frame rate (a camera reconfigured or back at \
         another size).",
        &|i| get(&sources[i].counters.size_changes),
    );
    out.header(
        "vidflow_source_state",
        "gauge",
        "1 for the state the source is in (connecting, streaming, retrying, stalled, ended).",
    );
    for s in sources {
        let now = s.counters.state();
        for state in SourceState::ALL {
            out.sample(
                "vidflow_source_state",
                &[("source", &s.name), ("state", state.name())],
                u64::from(state == now),
            );
        }
    }
    out.header(
        "vidflow_source_seconds_since_last_frame",
        "gauge",
        "Seconds since the source's last frame (absent before the first).",
    );
    for s in sources {
        if let Some(age) = s.counters.since_last_frame() {
            out.sample_f64(
                "vidflow_source_seconds_since_last_frame",
                &[("source", &s.name)],
                age.as_secs_f64(),
            );
        }
    }
    out.header(
        "vidflow_preview_jpegs_total",
        "counter",
        "JPEGs encoded for the live preview (only while someone watches).",
    );
    for s in sources {
        out.sample(
            "vidflow_preview_jpegs_total",
            &[("source", &s.name)],
            hub().encodes(&s.name),
        );
    }
    out.header(
        "vidflow_preview_watchers",
        "gauge",
        "Preview streams (/preview/SOURCE) open now.",
    );
    for s in sources {
        out.sample(
            "vidflow_preview_watchers",
            &[("source", &s.name)],
            u64::try_from(hub().watchers(&s.name)).unwrap_or(u64::MAX),
        );
    }

    record_streams(&mut out, sources);

    if let Some(executor) = &parts.executor {
        let steps = &executor.steps;
        out.header(
            "vidflow_step_runs_total",
            "counter",
            "Times the step ran (skips are not counted).",
        );
        for s in steps.iter() {
            out.sample(
                "vidflow_step_runs_total",
                &[("step", &s.name)],
                get(&s.runs),
            );
        }
        out.header(
            "vidflow_step_failures_total",
            "counter",
            "Runs of the step that failed.",
        );
        for s in steps.iter() {
            out.sample(
                "vidflow_step_failures_total",
                &[("step", &s.name)],
                get(&s.failures),
            );
        }
        out.header(
            "vidflow_step_state_resets_total",
            "counter",
            "Panics of the step after which its state for the frame's source was reset.",
        );
        for s in steps.iter() {
            out.sample(
                "vidflow_step_state_resets_total",
                &[("step", &s.name)],
                get(&s.state_resets),
            );
        }
        let name = "vidflow_step_duration_seconds";
        out.header(name, "histogram", "Time in the step per run.");
        for s in steps.iter() {
            let mut cumulative = 0;
            for (i, bucket) in s.buckets.iter().enumerate() {
                cumulative += get(bucket);
                let le = LATENCY_BUCKETS_S
                    .get(i)
                    .map_or_else(|| "+Inf".to_owned(), f64::to_string);
                out.sample(
                    &format!("{name}_bucket"),
                    &[("step", &s.name), ("le", &le)],
                    cumulative,
                );
            }
            out.sample_f64(
                &format!("{name}_sum"),
                &[("step", &s.name)],
                get(&s.total_us) as f64 / 1e6,
            );
            out.sample(&format!("{name}_count"), &[("step", &s.name)], cumulative);
        }
        out.header(
            "vidflow_executor_frames_in_flight",
            "gauge",
            "Frames admitted to the workflow and not yet delivered.",
        );
        out.sample(
            "vidflow_executor_frames_in_flight",
            &[],
            get(&executor.in_flight),
        );
        out.header(
            "vidflow_executor_wakeups_total",
            "counter",
            "Wake-ups of the executor's coordinator.",
        );
        out.sample(
            "vidflow_executor_wakeups_total",
            &[],
            get(&executor.coordinator_wakeups),
        );
    }
    if let Some(pool) = &parts.pool {
        out.header(
            "vidflow_pool_dispatches_total",
            "counter",
            "Steps queued on the worker pool.",
        );
        out.sample("vidflow_pool_dispatches_total", &[], get(&pool.dispatches));
        out.header(
            "vidflow_pool_wakeups_total",
            "counter",
            "Worker wake-ups from an idle wait.",
        );
        out.sample("vidflow_pool_wakeups_total", &[], get(&pool.wakeups));
    }

    let sinks: Vec<_> = parts
        .sinks
        .iter()
        .map(|s| (&s.name, s.sender.stats(), &s.sender))
        .collect();
    for (name, help, pick) in [
        ("vidflow_sink_written_total", "Frames the sink wrote.", 0),
        (
            "vidflow_sink_skipped_total",
            "Frames with nothing for the sink.",
            1,
        ),
        (
            "vidflow_sink_dropped_total",
            "Frames the sink lost (failed writes, a full queue).",
            2,
        ),
    ] {
        out.header(name, "counter", help);
        for (sink, stats, _) in &sinks {
            let value = [stats.written, stats.skipped, stats.dropped][pick];
            out.sample(name, &[("sink", sink)], value);
        }
    }
    out.header(
        "vidflow_sink_queue_depth",
        "gauge",
        "Results waiting in the sink's queue.",
    );
    for (sink, _, sender) in &sinks {
        out.sample(
            "vidflow_sink_queue_depth",
            &[("sink", sink)],
            sender.queue_len() as u64,
        );
    }

    if let Some(storage) = &parts.storage {
        storage_metrics(&mut out, &storage.snapshot());
    }

    let (delivered, failed) = live.delivered();
    out.header(
        "vidflow_frames_delivered_total",
        "counter",
        "Frames delivered to the sinks (processed or failed).",
    );
    out.sample("vidflow_frames_delivered_total", &[], delivered);
    out.header(
        "vidflow_frames_failed_total",
        "counter",
        "Delivered frames with a failed step.",
    );
    out.sample("vidflow_frames_failed_total", &[], failed);
    out.header("vidflow_phase", "gauge", "1 for the phase the run is in.");
    let now = live.phase();
    for phase in [
        Phase::Starting,
        Phase::Running,
        Phase::Reloading,
        Phase::Draining,
    ] {
        out.sample(
            "vidflow_phase",
            &[("phase", phase.name())],
            u64::from(phase == now),
        );
    }

    let process = Process::read();
    if let Some(cpu) = process.cpu_seconds {
        out.header(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time, in seconds.",
        );
        out.sample_f64("process_cpu_seconds_total", &[], cpu);
    }
    if let Some(rss) = process.resident_bytes {
        out.header(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory, in bytes.",
        );
        out.sample("process_resident_memory_bytes", &[], rss);
    }
    out.0
}

/// Retention: per sink, the files kept and purged; per filesystem, its space.
fn storage_metrics(out: &mut Text, report: &crate::storage::StorageReport) {
    type Pick = fn(&crate::storage::SinkTotals) -> u64;
    let per_sink: [(&str, &str, &str, Pick); 6] = [
        (
            "vidflow_storage_kept_bytes",
            "gauge",
            "Bytes of the sink's files kept.",
            |t| t.kept_bytes,
        ),
        (
            "vidflow_storage_kept_files",
            "gauge",
            "Files of the sink kept.",
            |t| t.kept_files,
        ),
        (
            "vidflow_storage_purged_bytes_total",
            "counter",
            "Bytes of the sink's files deleted by retention.",
            |t| t.purged_bytes,
        ),
        (
            "vidflow_storage_purged_files_total",
            "counter",
            "Files of the sink deleted by retention.",
            |t| t.purged_files,
        ),
        (
            "vidflow_storage_disk_full_total",
            "counter",
            "Writes of the sink that found their filesystem full.",
            |t| t.disk_full,
        ),
        (
            "vidflow_storage_undeletable_total",
            "counter",
            "Deletes of the sink's files that failed (the file is kept and counted, tried again later).",
            |t| t.undeletable,
        ),
    ];
    for (name, kind, help, pick) in per_sink {
        out.header(name, kind, help);
        for (sink, totals) in &report.sinks {
            out.sample(name, &[("sink", sink)], pick(totals));
        }
    }
    for (name, help, free) in [
        (
            "vidflow_storage_free_bytes",
            "Free bytes of a filesystem vidflow writes to (labelled by its first folder).",
            true,
        ),
        (
            "vidflow_storage_size_bytes",
            "Size of a filesystem vidflow writes to.",
            false,
        ),
    ] {
        out.header(name, "gauge", help);
        for fs in &report.filesystems {
            let folder = fs.folder.to_string_lossy();
            let value = if free { fs.free_bytes } else { fs.size_bytes };
            out.sample(name, &[("folder", &folder)], value);
        }
    }
}

/// The counters the page shows, as JSON.
pub(super) fn json(live: &Live) -> Vec<u8> {
    let parts = live.parts();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let sources: Vec<_> = parts
        .sources
        .iter()
        .map(|s| {
            let c = &s.counters;
            json!({
                "name": &*s.name,
                "live": s.live,
                "file": s.file,
                "state": c.state().name(),
                "decoded": get(&c.decoded),
                "dropped": get(&c.dropped),
                "throttled": get(&c.throttled),
                "reconnects": get(&c.reconnects),
                "size_changes": get(&c.size_changes),
                "preview": super::preview::available(&parts, &s.name),
            })
        })
        .collect();
    let sinks: Vec<_> = parts
        .sinks
        .iter()
        .map(|s| {
            let stats = s.sender.stats();
            json!({
                "name": &*s.name,
                "written": stats.written,
                "skipped": stats.skipped,
                "dropped": stats.dropped,
                "queue": s.sender.queue_len(),
            })
        })
        .collect();
    let (delivered, failed) = live.delivered();
    let value = json!({
        "phase": live.phase().name(),
        "uptime_s": live.started.elapsed().as_secs_f64(),
        "delivered": delivered,
        "failed": failed,
        "healthy": super::health::check(live).is_ok(),
        "sources": sources,
        "sinks": sinks,
    });
    serde_json::to_vec(&value).unwrap_or_default()
}

/// Prometheus text being written.
/// Which counter of a record stream a metric shows.
type StreamCounter = fn(&crate::source::SourceCounters) -> &AtomicU64;
/// Which counter of a record sink's source a metric shows.
type RecordCounter = fn(&crate::packets::RecordStats) -> &AtomicU64;

/// Each record stream's state (its own reconnections and stalls, apart from the decoded
/// stream's), and what each `record` sink wrote of each source (`crate::packets`).
fn record_streams(out: &mut Text, sources: &[crate::daemon::live::LiveSource]) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let recorded: Vec<_> = sources
        .iter()
        .filter_map(|s| s.record.as_ref().map(|r| (&s.name, r)))
        .collect();
    let name = "vidflow_record_stream_state";
    out.header(
        name,
        "gauge",
        "1 for the state the source's record stream is in (record_uri, else uri).",
    );
    for (source, r) in &recorded {
        let now = r.state();
        for state in SourceState::ALL {
            let labels = [("source", &***source), ("state", state.name())];
            out.sample(name, &labels, u64::from(state == now));
        }
    }
    let counters: [(&str, &str, StreamCounter); 2] = [
        (
            "vidflow_record_stream_reconnects_total",
            "Times the record stream came back after a loss.",
            |c| &c.reconnects,
        ),
        (
            "vidflow_record_stream_packets_total",
            "Encoded frames the record stream gave.",
            |c| &c.decoded,
        ),
    ];
    for (name, help, counter) in counters {
        out.header(name, "counter", help);
        for (source, r) in &recorded {
            out.sample(name, &[("source", source)], get(counter(r)));
        }
    }
    let rows = crate::packets::hub().record_rows();
    let per_sink: [(&str, &str, &str, RecordCounter); 5] = [
        (
            "vidflow_record_bytes_total",
            "counter",
            "Bytes of the camera's stream a record sink wrote.",
            |s| &s.bytes,
        ),
        (
            "vidflow_record_segments_total",
            "counter",
            "Segments a record sink started.",
            |s| &s.segments,
        ),
        (
            "vidflow_record_gaps_total",
            "counter",
            "Breaks in a recording: a lost stream, packets lost to a full queue, a failed write.",
            |s| &s.gaps,
        ),
        (
            "vidflow_record_keyframes_total",
            "counter",
            "Keyframes the camera sent to a record sink.",
            |s| &s.keyframes,
        ),
        (
            "vidflow_record_keyframe_interval_ms",
            "gauge",
            "Time between the camera's last two keyframes.",
            |s| &s.keyframe_interval_ms,
        ),
    ];
    for (name, kind, help, value) in per_sink {
        out.header(name, kind, help);
        for row in &rows {
            let labels = [("sink", &*row.sink), ("source", &*row.source)];
            out.sample(name, &labels, get(value(&row.stats)));
        }
    }
}

#[derive(Default)]
struct Text(String);

impl Text {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.0, " {value}");
    }

    fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labels(name, labels);
        let _ = writeln!(self.0, " {value}");
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.0.push_str(name);
        if labels.is_empty() {
            return;
        }
        self.0.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            let _ = write!(self.0, "{key}=\"{}\"", escape(value));
        }
        self.0.push('}');
    }
}

/// A label value escaped as the text format says: backslash, double quote, line feed.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// This process's CPU time and resident memory, from `/proc/self` only (the unit's
/// `ProcSubset=pid` hides the rest of `/proc`).
struct Process {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
}

impl Process {
    fn read() -> Self {
        // SAFETY: sysconf only reads a system constant; no memory is passed.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let statm = std::fs::read_to_string("/proc/self/statm").ok();
        Self {
            cpu_seconds: stat
                .as_deref()
                .and_then(cpu_ticks)
                .filter(|_| ticks > 0)
                .map(|t| t as f64 / ticks as f64),
            resident_bytes: statm
                .as_deref()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
                .and_then(|pages| pages.checked_mul(u64::try_from(page).ok()?)),
        }
    }
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the command name in field 2
/// may hold spaces and parentheses, so fields are counted after its last `)`).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let line = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(cpu_ticks(line), Some(300));
    }

    #[test]
    fn every_storage_total_of_a_sink_is_a_sample() {
        let totals = crate::storage::SinkTotals {
            kept_files: 1,
            kept_bytes: 2,
            purged_files: 3,
            purged_bytes: 4,
            disk_full: 5,
            undeletable: 6,
        };
        let report = crate::storage::StorageReport {
            sinks: [("rec".to_owned(), totals)].into_iter().collect(),
            filesystems: Vec::new(),
        };
        let mut out = Text(String::new());
        storage_metrics(&mut out, &report);
        for (name, value) in [
            ("kept_files", 1),
            ("kept_bytes", 2),
            ("purged_files_total", 3),
            ("purged_bytes_total", 4),
            ("disk_full_total", 5),
            ("undeletable_total", 6),
        ] {
            let line = format!("vidflow_storage_{name}{{sink=\"rec\"}} {value}\n");
            assert!(out.0.contains(&line), "{line} in\n{}", out.0);
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

#[cfg(test)]
mod golden;
