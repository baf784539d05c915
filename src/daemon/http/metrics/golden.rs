//! `/metrics` byte for byte on a fixed state: the table that writes it must write what the
//! hand-written function wrote (`golden.txt`, its output before the table). The process's CPU
//! time and memory are left out (they change), and so are the record streams' rows of other
//! tests' sinks (the packet hub is one per process).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Text, render, storage_metrics};
use crate::config::{SourceText, load_text};
use crate::daemon::Live;
use crate::daemon::live::{LiveSink, LiveSource, Parts, Phase};
use crate::sinks::SinkRunner;
use crate::source::SourceCounters;
use crate::storage::{
    FilesystemReport, SinkTotals, Storage, StorageConfig, StorageReport, SystemClock,
};
use crate::workflow::{Executor, Graph, PoolMetrics};

const PIPELINE: &str = r#"
[sources.golden-a]
uri = "test://ball?width=64&height=48"

[sources.golden-b]
uri = "test://ball?width=64&height=48"

[steps.small]
kind = "resize"
image = "$frame"
width = 32
height = 24

[steps.gray]
kind = "grayscale"
image = "$steps.small.image"

[sinks.lines]
kind = "jsonl"
path = "PATH"
include = ["$steps.gray.image"]
"#;

fn counters(base: u64) -> Arc<SourceCounters> {
    let c = SourceCounters::default();
    for (i, a) in [
        &c.decoded,
        &c.dropped,
        &c.throttled,
        &c.copied,
        &c.reconnects,
        &c.size_changes,
    ]
    .into_iter()
    .enumerate()
    {
        a.store(base + i as u64, Ordering::Relaxed);
    }
    if base == 1 {
        // A camera 1.25 s slow; the other sends no sender reports (no sample).
        c.set_clock_skew(-1_250_000_000);
    }
    Arc::new(c)
}

fn source(name: &str, base: u64, record: bool) -> LiveSource {
    LiveSource {
        name: name.into(),
        live: true,
        file: false,
        counters: counters(base),
        record: record.then(|| counters(base + 100)),
        stall_timeout: Duration::from_secs(5),
    }
}

/// The text of `/metrics` on a fixed state, without the lines that change by themselves.
fn rendered(dir: &Path) -> String {
    let text = PIPELINE.replace("PATH", &dir.join("lines.jsonl").display().to_string());
    let pipeline = load_text(&SourceText::new("golden.toml", text)).unwrap();
    let executor = Executor::owning(Arc::new(Graph::new(pipeline.steps)), pipeline.executor);
    let metrics = executor.metrics().clone();
    for (i, step) in metrics.steps.iter().enumerate() {
        let i = i as u64;
        step.runs.store(10 + i, Ordering::Relaxed);
        step.failures.store(1 + i, Ordering::Relaxed);
        step.state_resets.store(i, Ordering::Relaxed);
        step.total_us.store(1_234_567 + i, Ordering::Relaxed);
        for (b, bucket) in step.buckets.iter().enumerate() {
            bucket.store(b as u64 % 3 + i, Ordering::Relaxed);
        }
    }
    metrics.in_flight.store(3, Ordering::Relaxed);
    metrics.coordinator_wakeups.store(77, Ordering::Relaxed);
    let pool = PoolMetrics::default();
    pool.dispatches.store(55, Ordering::Relaxed);
    pool.wakeups.store(44, Ordering::Relaxed);
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let config = &pipeline.sinks[0];
    let sink = config
        .factory
        .open(&config.name, &config.inputs, &storage)
        .unwrap();
    let runner = SinkRunner::spawn(&config.name, sink, config.routing.clone()).unwrap();
    let live = Live::new();
    live.set_parts(Parts {
        sources: vec![
            source("golden-a", 1, true),
            source("golden \"b\"", 20, false),
        ],
        sinks: vec![LiveSink {
            name: "lines".into(),
            sender: runner.sender(),
        }],
        executor: Some(metrics),
        pool: Some(Arc::new(pool)),
        storage: None,
        events: None,
    });
    live.set_phase(Phase::Running);
    live.count_delivered(false);
    live.count_delivered(true);
    let out = render(&live);
    let _ = runner.begin_close().wait_until(None);
    storage.stop();
    out.lines()
        .filter(|l| {
            !l.starts_with("process_")
                && !l.contains("# HELP process_")
                && !l.contains("# TYPE process_")
        })
        .filter(|l| !l.starts_with("vidflow_record_") || l.contains("golden"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn metrics_are_written_as_before_on_a_fixed_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = rendered(dir.path());
    let report = StorageReport {
        sinks: [(
            "rec".to_owned(),
            SinkTotals {
                kept_files: 1,
                kept_bytes: 2,
                purged_files: 3,
                purged_bytes: 4,
                disk_full: 5,
                undeletable: 6,
            },
        )]
        .into_iter()
        .collect(),
        filesystems: vec![FilesystemReport {
            folder: "/var/lib/vidflow".into(),
            free_bytes: 7,
            size_bytes: 8,
        }],
    };
    let mut text = Text::default();
    storage_metrics(&mut text, &report);
    out.push_str(&text.0);
    if std::env::var_os("VIDFLOW_WRITE_GOLDEN").is_some() {
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/daemon/http/metrics/golden.txt"
            ),
            &out,
        )
        .unwrap();
    }
    let golden = include_str!("golden.txt");
    assert!(out == golden, "/metrics changed:\n{out}");
}
