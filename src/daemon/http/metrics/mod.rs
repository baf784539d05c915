//! `/metrics` in Prometheus' text format (version 0.0.4), written from a table (`table.rs`),
//! and `/stats.json` for the page. Both read `Live`: atomics, and its parts once per request.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use crate::daemon::Live;
use crate::daemon::live::{Parts, Phase};
use crate::packets::RecordRow;
use crate::sinks::{SinkSender, SinkStats};
use crate::source::SourceState;
use crate::storage::{Storage, StorageReport};
use crate::workflow::{LATENCY_BUCKETS_S, StepMetrics};
use table::{METRICS, Metric, Read};

#[cfg(test)]
mod golden;
mod table;

/// What one request's metrics are read from: the run's parts once, each sink's counts once,
/// the storage's published snapshot (never its lock) and `/proc/self` once.
struct State<'a> {
    live: &'a Live,
    parts: Arc<Parts>,
    sinks: Vec<(Arc<str>, SinkStats, SinkSender)>,
    rows: Vec<RecordRow>,
    storage: Option<Arc<StorageReport>>,
    process: Process,
}

impl<'a> State<'a> {
    fn read(live: &'a Live) -> Self {
        let parts = live.parts();
        let sinks = parts
            .sinks
            .iter()
            .map(|s| (s.name.clone(), s.sender.stats(), s.sender.clone()))
            .collect();
        Self {
            live,
            sinks,
            rows: crate::packets::hub().record_rows(),
            storage: parts.storage.as_ref().map(Storage::snapshot),
            parts,
            process: Process::read(),
        }
    }
}

/// The text of `/metrics`.
pub(super) fn render(live: &Live) -> String {
    let state = State::read(live);
    let mut out = Text::default();
    for metric in METRICS {
        metric.write(&state, &mut out);
    }
    out.0
}

impl Metric {
    /// Whether the run has the part this metric reads.
    fn shown(&self, state: &State<'_>) -> bool {
        match self.read {
            Read::Step(_) | Read::StepDuration | Read::Executor(_) => {
                state.parts.executor.is_some()
            }
            Read::Pool(_) => state.parts.pool.is_some(),
            Read::StorageSink(_) | Read::Filesystem(_) => state.storage.is_some(),
            Read::CpuSeconds => state.process.cpu_seconds.is_some(),
            Read::ResidentBytes => state.process.resident_bytes.is_some(),
            _ => true,
        }
    }

    fn write(&self, state: &State<'_>, out: &mut Text) {
        if !self.shown(state) {
            return;
        }
        out.header(self.name, self.kind, self.help);
        match self.read {
            Read::Source(_)
            | Read::SourceState
            | Read::SourceAge
            | Read::SourceClockSkew
            | Read::Preview(_)
            | Read::Video(_)
            | Read::RecordState
            | Read::RecordStream(_)
            | Read::RecordSink(_)
            | Read::RecordRingDropped => self.per_source(state, out),
            _ => self.per_part(state, out),
        }
    }

    /// The samples of a source's metric, or of its record stream's.
    fn per_source(&self, state: &State<'_>, out: &mut Text) {
        let name = self.name;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let sources = &state.parts.sources;
        let recorded = sources
            .iter()
            .filter_map(|s| s.record.as_ref().map(|r| (&*s.name, r)));
        match self.read {
            Read::Source(counter) => {
                for s in sources {
                    out.sample(name, &[("source", &s.name)], get(counter(&s.counters)));
                }
            }
            Read::SourceState => {
                for s in sources {
                    out.states(name, &s.name, s.counters.state());
                }
            }
            Read::SourceAge => {
                for s in sources {
                    if let Some(age) = s.counters.since_last_frame() {
                        out.sample_f64(name, &[("source", &s.name)], age.as_secs_f64());
                    }
                }
            }
            Read::SourceClockSkew => {
                for s in sources {
                    if let Some(skew) = s.counters.clock_skew_s() {
                        out.sample_f64(name, &[("source", &s.name)], skew);
                    }
                }
            }
            Read::Preview(value) => {
                for s in sources {
                    out.sample(name, &[("source", &s.name)], value(&s.name));
                }
            }
            Read::Video(counter) => {
                for s in sources {
                    let video = crate::packets::hub().video(&s.name);
                    out.sample(name, &[("source", &s.name)], get(counter(&video)));
                }
            }
            Read::RecordState => {
                for (source, r) in recorded {
                    out.states(name, source, r.state());
                }
            }
            Read::RecordStream(counter) => {
                for (source, r) in recorded {
                    out.sample(name, &[("source", source)], get(counter(r)));
                }
            }
            Read::RecordSink(counter) => {
                for row in &state.rows {
                    let labels = [("sink", &*row.sink), ("source", &*row.source)];
                    out.sample(name, &labels, get(counter(&row.stats)));
                }
            }
            Read::RecordRingDropped => {
                for row in &state.rows {
                    let s = &row.stats;
                    let by = [
                        ("bytes", &s.ring_dropped_bytes),
                        ("duration", &s.ring_dropped_duration),
                    ];
                    for (bound, counter) in by {
                        let labels = [
                            ("sink", &*row.sink),
                            ("source", &*row.source),
                            ("bound", bound),
                        ];
                        out.sample(name, &labels, get(counter));
                    }
                }
            }
            _ => {}
        }
    }

    /// The samples of a metric of the steps, the pool, the sinks, the storage or the run.
    fn per_part(&self, state: &State<'_>, out: &mut Text) {
        let name = self.name;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        match self.read {
            Read::Step(counter) => {
                for s in state.parts.executor.iter().flat_map(|e| e.steps.iter()) {
                    out.sample(name, &[("step", &s.name)], get(counter(s)));
                }
            }
            Read::StepDuration => {
                for s in state.parts.executor.iter().flat_map(|e| e.steps.iter()) {
                    out.histogram(name, s);
                }
            }
            Read::Executor(counter) => {
                if let Some(e) = &state.parts.executor {
                    out.sample(name, &[], get(counter(e)));
                }
            }
            Read::Pool(counter) => {
                if let Some(p) = &state.parts.pool {
                    out.sample(name, &[], get(counter(p)));
                }
            }
            Read::Sink(value) => {
                for (sink, stats, sender) in &state.sinks {
                    out.sample(name, &[("sink", sink)], value(stats, sender));
                }
            }
            Read::StorageSink(value) => {
                for (sink, totals) in state.storage.iter().flat_map(|r| &r.sinks) {
                    out.sample(name, &[("sink", sink)], value(totals));
                }
            }
            Read::Filesystem(value) => {
                for fs in state.storage.iter().flat_map(|r| &r.filesystems) {
                    let folder = fs.folder.to_string_lossy();
                    out.sample(name, &[("folder", &folder)], value(fs));
                }
            }
            Read::Delivered(value) => out.sample(name, &[], value(state.live.delivered())),
            Read::Feed(counter) => out.sample(name, &[], get(counter(&state.live.feed))),
            Read::Phase => {
                let now = state.live.phase();
                for phase in [
                    Phase::Starting,
                    Phase::Running,
                    Phase::Reloading,
                    Phase::Draining,
                ] {
                    out.sample(name, &[("phase", phase.name())], u64::from(phase == now));
                }
            }
            Read::CpuSeconds => {
                if let Some(cpu) = state.process.cpu_seconds {
                    out.sample_f64(name, &[], cpu);
                }
            }
            Read::ResidentBytes => {
                if let Some(rss) = state.process.resident_bytes {
                    out.sample(name, &[], rss);
                }
            }
            _ => {}
        }
    }
}

/// Only the storage's metrics, on `report` (for tests: a storage's snapshot is its thread's).
#[cfg(test)]
fn storage_metrics(out: &mut Text, report: &StorageReport) {
    let live = Live::new();
    let mut state = State::read(&live);
    state.storage = Some(Arc::new(report.clone()));
    let storage = |m: &&Metric| matches!(m.read, Read::StorageSink(_) | Read::Filesystem(_));
    for metric in METRICS.iter().filter(storage) {
        metric.write(&state, out);
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
#[derive(Default)]
struct Text(String);

impl Text {
    /// One sample per state of `source`: 1 for the state it is in (`now`).
    fn states(&mut self, name: &str, source: &str, now: SourceState) {
        for state in SourceState::ALL {
            let labels = [("source", source), ("state", state.name())];
            self.sample(name, &labels, u64::from(state == now));
        }
    }

    /// A step's run times: cumulative buckets, their sum and their count.
    fn histogram(&mut self, name: &str, s: &StepMetrics) {
        let mut cumulative = 0;
        for (i, bucket) in s.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS_S
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), f64::to_string);
            let labels = [("step", &*s.name), ("le", &le)];
            self.sample(&format!("{name}_bucket"), &labels, cumulative);
        }
        let sum = s.total_us.load(Ordering::Relaxed) as f64 / 1e6;
        self.sample_f64(&format!("{name}_sum"), &[("step", &s.name)], sum);
        self.sample(&format!("{name}_count"), &[("step", &s.name)], cumulative);
    }

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
