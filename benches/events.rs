//! The event store's queries at scale: `GET /api/events` and `/api/counts` over 1,000,000
//! rows, and the page's first request (its newest 60 events, as JSON) with 10,000 events,
//! each against the same query on an empty store in the same run (the baseline: what opening
//! a connection and preparing the statement cost).
//!
//!     cargo bench --bench events
//!
//! Prints the median of 15 runs of each query, and its ratio to the baseline.
//!
//! Then a month of ten cameras (`paging.rs`): every count by minute and every recording, each
//! read as the API answered before it had pages (one query, one JSON answer) and page by page,
//! each way in a process of its own, with its time and peak RSS, and their ratios:
//!
//!     cargo bench --bench events -- paging
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "events/paging.rs"]
mod paging;

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::params;
use vidflow::events::query::{self, CountFilter, EventFilter};
use vidflow::events::schema;

const RUNS: usize = 15;
/// Mid-run time, ms since 1970.
const NOW: i64 = 1_796_288_400_000;

/// Fills a store with `n` events over 30 days: 4 sources, 5 kinds, 5 labels, a crossing in 4.
fn fill(path: &Path, n: usize) {
    let mut conn = schema::open_writer(path).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO events (start_ms, end_ms, source, kind, label, track_id, score, step,
                 place, direction, box, snapshot, clip)
                 VALUES (?1, ?1, ?2, ?3, ?4, ?5, 0.8, 'crossing', 'door', 'in', '[1,2,3,4]',
                 'out/snapshots/x.jpg', 'out/clips/x.mp4')",
            )
            .unwrap();
        let mut count = tx
            .prepare(
                "INSERT INTO counts (source, step, place, name, minute, n) VALUES (?1, 'crossing',
                 'door', 'in', ?2, 1) ON CONFLICT DO UPDATE SET n = n + 1",
            )
            .unwrap();
        let span = 30 * 86_400_000_i64;
        for i in 0..n {
            let t = NOW - span + (i as i64) * span / n as i64;
            let source = ["front", "back", "yard", "gate"][i % 4];
            let kind = ["track", "crossing", "enter", "leave", "motion"][i % 5];
            let label = ["person", "car", "dog", "bicycle", "truck"][(i / 7) % 5];
            insert
                .execute(params![t, source, kind, label, i as i64])
                .unwrap();
            if kind == "crossing" {
                count.execute(params![source, t / 60_000]).unwrap();
            }
        }
    }
    tx.commit().unwrap();
}

fn median(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
    q.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn main() {
    if paging::child() {
        return;
    }
    if std::env::args().any(|a| a == "paging") {
        paging::run();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    let big = dir.path().join("big.db");
    let page = dir.path().join("page.db");
    fill(&empty, 0);
    let started = Instant::now();
    fill(&big, 1_000_000);
    println!("filled 1,000,000 events in {:.1?}", started.elapsed());
    fill(&page, 10_000);
    let hour_ago = (NOW - 3_600_000).to_string();
    let week_ago = (NOW - 7 * 86_400_000).to_string();
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        ("newest 100", pairs(&[])),
        ("label=dog, 100", pairs(&[("label", "dog")])),
        (
            "source=gate&kind=crossing, 100",
            pairs(&[("source", "gate"), ("kind", "crossing")]),
        ),
        (
            "last hour, 1000",
            pairs(&[("after", &hour_ago), ("limit", "1000")]),
        ),
        (
            "label=truck&before=a week ago, 100",
            pairs(&[("label", "truck"), ("before", &week_ago)]),
        ),
    ];
    println!("events query over 1,000,000 rows (median of {RUNS}), against an empty store:");
    for (name, q) in &cases {
        let f = EventFilter::from_pairs(q).unwrap();
        let base = median(|| drop(query::events(&empty, &f).unwrap()));
        let mut rows = 0;
        let t = median(|| rows = query::events(&big, &f).unwrap().len());
        println!(
            "  {name:38} {rows:5} rows  {t:>10.2?}  (empty {base:.2?}, x{:.1})",
            t.as_secs_f64() / base.as_secs_f64()
        );
    }
    for bucket in ["hour", "day"] {
        let f =
            CountFilter::from_pairs(&pairs(&[("bucket", bucket), ("after", &week_ago)])).unwrap();
        let base = median(|| drop(query::counts(&empty, &f).unwrap()));
        let mut rows = 0;
        let t = median(|| rows = query::counts(&big, &f).unwrap().rows.len());
        println!(
            "  counts by {bucket:4}, last week            {rows:5} rows  {t:>10.2?}  (empty {base:.2?}, x{:.1})",
            t.as_secs_f64() / base.as_secs_f64()
        );
    }
    // The page's first request: its newest 60 events, as the JSON the API sends.
    let f = EventFilter::from_pairs(&pairs(&[("limit", "60")])).unwrap();
    let json = |path: &Path| {
        serde_json::to_vec(&query::events(path, &f).unwrap())
            .unwrap()
            .len()
    };
    let base = median(|| {
        json(&empty);
    });
    let mut bytes = 0;
    let t = median(|| bytes = json(&page));
    println!(
        "page load with 10,000 events: newest 60 as JSON ({bytes} bytes) {t:.2?} (empty {base:.2?}, x{:.1})",
        t.as_secs_f64() / base.as_secs_f64()
    );
    paging::run();
}
