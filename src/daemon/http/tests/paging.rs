//! `/api/counts` and `/api/recordings` a page at a time, on a real socket, while the store and
//! the storage take new rows between the pages: the pages, followed by their `Link`, hold
//! exactly what one unpaged read holds, none twice and none missing.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{get, loopback, serve};
use crate::daemon::live::Parts;
use crate::events::{EventStore, EventsConfig, schema};
use crate::storage::{Class, FilePolicy, Retention, Storage, StorageConfig, SystemClock};

/// A page's status, its `Link: <...>; rel="next"` target (as a path under `/api/`) and body.
fn page(addr: std::net::SocketAddr, path: &str) -> (Option<String>, serde_json::Value) {
    let answer = get(addr, path, "");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{path}: {answer}");
    let link = head
        .lines()
        .find_map(|l| l.strip_prefix("Link: "))
        .map(|l| {
            let (target, rel) = l.split_once(">; ").unwrap();
            assert_eq!(rel, "rel=\"next\"", "{l}");
            format!("/api/{}", target.strip_prefix('<').unwrap())
        });
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    // The body's cursor is the one the link carries.
    match (&link, body["next"].as_str()) {
        (Some(link), Some(next)) => assert!(link.ends_with(&format!("cursor={next}")), "{link}"),
        (None, None) => {}
        other => panic!("{path}: link and next disagree: {other:?}"),
    }
    (link, body)
}

/// Every page of `first`, following each page's link; `between` runs between two pages.
fn all_pages(
    addr: std::net::SocketAddr,
    first: &str,
    key: &str,
    mut between: impl FnMut(&serde_json::Value),
) -> (Vec<serde_json::Value>, usize) {
    let (mut rows, mut pages, mut next) = (Vec::new(), 0, Some(first.to_owned()));
    while let Some(path) = next {
        let (link, body) = page(addr, &path);
        let items = body[key].as_array().unwrap();
        assert!(!items.is_empty(), "{path}: an empty page");
        rows.extend(items.iter().cloned());
        pages += 1;
        if link.is_some() {
            between(items.last().unwrap());
        }
        next = link;
    }
    (rows, pages)
}

/// The counts as one unpaged query sums them (the query the route ran before it had pages).
fn unpaged_counts(db: &Path, minutes: i64) -> Vec<serde_json::Value> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT source, step, place, name, (minute / ?1) * ?1 * 60000 AS t, sum(n) FROM counts
             GROUP BY source, step, place, name, t ORDER BY t, source, step, place, name",
        )
        .unwrap();
    stmt.query_map([minutes], |r| {
        Ok(
            serde_json::json!({"source": r.get::<_, String>(0)?, "step": r.get::<_, String>(1)?,
            "place": r.get::<_, String>(2)?, "name": r.get::<_, String>(3)?,
            "t": r.get::<_, i64>(4)?, "n": r.get::<_, i64>(5)?}),
        )
    })
    .unwrap()
    .collect::<rusqlite::Result<_>>()
    .unwrap()
}

/// Fails with the first row where `paged` and `unpaged` part.
fn same(paged: &[serde_json::Value], unpaged: &[serde_json::Value], what: &str) {
    let at = paged.iter().zip(unpaged).position(|(a, b)| a != b);
    let at = at.unwrap_or(paged.len().min(unpaged.len()));
    assert!(
        paged.len() == unpaged.len() && at == paged.len(),
        "{what}: {} rows paged, {} unpaged; from row {at}: paged {:?}, unpaged {:?}",
        paged.len(),
        unpaged.len(),
        &paged[at..paged.len().min(at + 3)],
        &unpaged[at..unpaged.len().min(at + 3)],
    );
}

const SOURCES: [&str; 3] = ["back", "front", "gate"];

#[test]
fn count_pages_hold_exactly_the_unpaged_counts_while_rows_are_added() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let writer = schema::open_writer(&db).unwrap();
    let add = |minute: i64, source: &str, name: &str, n: i64| {
        writer
            .execute(
                "INSERT INTO counts (source, step, place, name, minute, n)
                 VALUES (?1, 'line', 'door', ?2, ?3, ?4) ON CONFLICT DO UPDATE SET n = n + ?4",
                rusqlite::params![source, name, minute, n],
            )
            .unwrap();
    };
    let start = 29_938_140; // 2026-12-03T09:00Z, in minutes.
    for m in 0..300 {
        for (i, source) in SOURCES.iter().enumerate() {
            if (m + i as i64) % 4 != 0 {
                add(start + m, source, ["in", "out"][m as usize % 2], 1 + m % 3);
            }
        }
    }
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let _stop = storage.stop_on_drop();
    let config = EventsConfig {
        path: db.clone(),
        retain: Duration::from_secs(86_400 * 3650),
    };
    let store = EventStore::start(&config, storage).unwrap();
    let (server, _live) = serve(
        loopback(),
        Parts {
            events: Some(store.clone()),
            ..Parts::default()
        },
    );
    for (bucket, minutes, limit) in [("minute", 1, 7), ("hour", 60, 3)] {
        // After each page, rows the writer would add meanwhile: to later buckets (a series
        // before the cursor's, and one after it), and at the end.
        let mut later = start + 300;
        let (rows, pages) = all_pages(
            server.addr,
            &format!("/api/counts?bucket={bucket}&limit={limit}&source="),
            "counts",
            |last| {
                let bucket_end = last["t"].as_i64().unwrap() / 60_000 + minutes;
                add(bucket_end + 5, "back", "out", 2);
                add(bucket_end + 5, "gate", "in", 1);
                // (Never before the cursor: no page after it would hold that.)
                later = (later + 1).max(bucket_end);
                add(later, "front", "in", 1);
            },
        );
        assert!(pages >= 8, "{pages} pages");
        same(&rows, &unpaged_counts(&db, minutes), bucket);
    }
    drop(server);
    store.stop();
}

#[test]
fn recording_pages_hold_exactly_the_unpaged_list_while_files_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let _stop = storage.stop_on_drop();
    let files = storage.sink(
        "rec",
        FilePolicy {
            class: Class::Continuous,
            retention: Retention::default(),
            expected_file: 1,
        },
    );
    let mut n = 0;
    let mut make = |source: &str| {
        n += 1;
        let path = dir.path().join(format!("{source}-{n:04}.mp4"));
        std::fs::write(&path, b"x").unwrap();
        drop(files.create(&path, source).unwrap());
    };
    for i in 0..60 {
        make(SOURCES[i % 3]);
    }
    let names = |list: &[serde_json::Value]| -> Vec<String> {
        list.iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // The whole list, newest first, as one read of the index gives it (the truth: files made
    // after the first page are newer than it, so no page holds them).
    let unpaged = |source: Option<&str>| -> Vec<String> {
        let mut all: Vec<String> = storage
            .files(Some(Class::Continuous))
            .iter()
            .filter(|f| source.is_none_or(|s| *f.source == *s))
            .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        all.reverse();
        all
    };
    let (server, _live) = serve(
        loopback(),
        Parts {
            storage: Some(storage.clone()),
            ..Parts::default()
        },
    );
    for source in [None, Some("front")] {
        let truth = unpaged(source);
        let first = format!("/api/recordings?limit=7&source={}", source.unwrap_or(""));
        let (rows, pages) = all_pages(server.addr, &first, "recordings", |_| make("front"));
        assert!(pages >= 3, "{pages} pages");
        assert_eq!(names(&rows), truth, "source {source:?}");
    }
}
