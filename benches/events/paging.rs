//! A month of ten cameras, read whole: every count by minute (4 series a camera: two lines,
//! in and out, 1,728,000 rows) and every recording (one-minute segments, 432,000 files), each
//! as the API answered before it had pages (one query, one JSON answer of everything: the
//! baseline) and page by page (`limit` at its largest, following `next`), each in a child
//! process of its own, so that each peak RSS is its own.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use rusqlite::params;
use serde_json::json;
use vidflow::events::query::{self, CountFilter};
use vidflow::events::schema;
use vidflow::storage::{
    Class, FilePolicy, Retention, Storage, StorageConfig, StoredFile, SystemClock,
};

const CAMERAS: usize = 10;
const MINUTES: i64 = 30 * 1440;
/// The first minute of the month, minutes since 1970 (2026-12-03T09:00Z).
const START: i64 = 29_938_140;
/// The child's mode, in its environment: `counts-once`, `counts-pages`, `recordings-once`,
/// `recordings-pages`; and the store it reads.
const MODE: &str = "VIDFLOW_BENCH_PAGING";
const DB: &str = "VIDFLOW_BENCH_PAGING_DB";

fn fill_counts(path: &Path) {
    let mut conn = schema::open_writer(path).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO counts (source, step, place, name, minute, n)
                 VALUES (?1, 'crossing', ?2, ?3, ?4, ?5)",
            )
            .unwrap();
        for m in 0..MINUTES {
            for camera in 0..CAMERAS {
                for place in ["door", "gate"] {
                    for name in ["in", "out"] {
                        let n = 1 + (m + camera as i64) % 5;
                        insert
                            .execute(params![format!("cam{camera}"), place, name, START + m, n])
                            .unwrap();
                    }
                }
            }
        }
    }
    tx.commit().unwrap();
}

/// The counts route before pages: one query of everything, one JSON value, one answer.
fn counts_once(db: &Path) -> (usize, usize) {
    let conn = schema::open_reader(db).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT source, step, place, name, (minute / ?1) * ?1 * 60000 AS t, sum(n) FROM counts
             GROUP BY source, step, place, name, t ORDER BY t, source, step, place, name",
        )
        .unwrap();
    let rows: Vec<serde_json::Value> = stmt
        .query_map([1], |r| {
            Ok(
                json!({"source": r.get::<_, String>(0)?, "step": r.get::<_, String>(1)?,
                "place": r.get::<_, String>(2)?, "name": r.get::<_, String>(3)?,
                "t": r.get::<_, i64>(4)?, "n": r.get::<_, i64>(5)?}),
            )
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let n = rows.len();
    (n, serde_json::to_vec(&json!(rows)).unwrap().len())
}

/// The counts route now: page after page, each its own answer.
fn counts_pages(db: &Path) -> (usize, usize) {
    let (mut rows, mut bytes, mut cursor) = (0, 0, None);
    loop {
        let mut pairs = vec![
            ("bucket".to_owned(), "minute".to_owned()),
            ("limit".to_owned(), query::MAX_COUNTS.to_string()),
        ];
        pairs.extend(cursor.take().map(|c| ("cursor".to_owned(), c)));
        let page = query::counts(db, &CountFilter::from_pairs(&pairs).unwrap()).unwrap();
        let next = page.next.map(|c| query::cursor(&c));
        rows += page.rows.len();
        bytes += serde_json::to_vec(&json!({"counts": json!(page.rows), "next": next}))
            .unwrap()
            .len();
        match next {
            Some(c) => cursor = Some(c),
            None => return (rows, bytes),
        }
    }
}

/// A storage that lists a month of one-minute segments of each camera.
fn recordings(dir: &Path) -> Storage {
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let files = storage.sink(
        "rec",
        FilePolicy {
            class: Class::Continuous,
            retention: Retention::default(),
            expected_file: 1,
        },
    );
    for m in 0..MINUTES {
        for camera in 0..CAMERAS {
            let path = dir.join(format!("cam{camera}-{m:06}.mp4"));
            drop(files.create(&path, &format!("cam{camera}")).unwrap());
        }
    }
    storage
}

fn file_json(f: &StoredFile) -> serde_json::Value {
    let ms = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let name = f.path.file_name().unwrap().to_string_lossy().into_owned();
    json!({"source": &*f.source, "sink": &*f.sink, "url": format!("api/media/{}/{name}", f.sink),
        "name": name, "start": ms(f.created), "end": f.closed.map(ms), "bytes": f.bytes})
}

/// The recordings route before pages: every file copied, reversed, one answer.
fn recordings_once(storage: &Storage) -> (usize, usize) {
    let mut files = storage.files(Some(Class::Continuous));
    files.reverse();
    let all: Vec<_> = files.iter().map(file_json).collect();
    (all.len(), serde_json::to_vec(&json!(all)).unwrap().len())
}

fn recordings_pages(storage: &Storage) -> (usize, usize) {
    let (mut rows, mut bytes, mut below) = (0, 0, None);
    loop {
        let (files, next) = storage.page(Class::Continuous, below, 1000, |_, _, _| true);
        rows += files.len();
        let items: Vec<_> = files.iter().map(file_json).collect();
        bytes += serde_json::to_vec(&json!({"recordings": items, "next": next}))
            .unwrap()
            .len();
        match next {
            Some(n) => below = Some(n),
            None => return (rows, bytes),
        }
    }
}

/// The process's peak resident set so far, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// In a child: reads the store whole one way, prints `seconds peak_before peak_after rows
/// bytes`, and says it was one.
pub(crate) fn child() -> bool {
    let Ok(mode) = std::env::var(MODE) else {
        return false;
    };
    let db = std::path::PathBuf::from(std::env::var(DB).unwrap());
    let storage = mode.starts_with("recordings").then(|| recordings(&db));
    let before = peak_mib();
    let started = Instant::now();
    let (rows, bytes) = match (mode.as_str(), &storage) {
        ("counts-once", _) => counts_once(&db),
        ("counts-pages", _) => counts_pages(&db),
        ("recordings-once", Some(s)) => recordings_once(s),
        ("recordings-pages", Some(s)) => recordings_pages(s),
        _ => panic!("unknown mode {mode}"),
    };
    let t = started.elapsed().as_secs_f64();
    println!("{t} {before} {} {rows} {bytes}", peak_mib());
    true
}

/// (seconds, peak RSS growth MiB, rows, bytes) of one way, in a child process.
fn measure(mode: &str, db: &Path) -> (f64, f64, u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(MODE, mode)
        .env(DB, db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[2] - v[1], v[3] as u64, v[4] as u64)
}

pub(crate) fn run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("month.db");
    let started = Instant::now();
    fill_counts(&db);
    println!(
        "a month of {CAMERAS} cameras: counts filled in {:.1?}",
        started.elapsed()
    );
    for what in ["counts", "recordings"] {
        // Each recordings child has a folder of its own (its storage's index).
        let store = |way: &str| match what {
            "counts" => db.clone(),
            _ => dir.path().join(way),
        };
        let (t0, m0, rows0, b0) = measure(&format!("{what}-once"), &store("once"));
        let (t1, m1, rows1, b1) = measure(&format!("{what}-pages"), &store("pages"));
        assert_eq!(rows0, rows1, "{what}: the pages hold what one answer held");
        println!(
            "  {what:10} {rows0} rows: one answer {t0:.2} s, +{m0:.0} MiB peak ({} MB of JSON); \
             every page {t1:.2} s, +{m1:.0} MiB peak ({} MB); time x{:.2}, peak memory x{:.3}",
            b0 / 1_000_000,
            b1 / 1_000_000,
            t1 / t0,
            m1 / m0.max(1.0),
        );
    }
}
