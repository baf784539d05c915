//! The store on a real SQLite file, fed through [`EventStore::record`] as the executor feeds
//! it: frames made here with the timestamps a source gives (the point is their timing).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::*;
use crate::frame::Frame;
use crate::outcome::{FrameRecord, Outcome};
use crate::storage::{StorageConfig, SystemClock};
use crate::value::{BBox, Detection};

const BBOX: BBox = BBox {
    x: 10.0,
    y: 10.0,
    width: 20.0,
    height: 40.0,
};

/// The tracker's output, step 0.
fn taps() -> Vec<Output> {
    vec![Output {
        step: "tracker".into(),
        at: Ref::Step { step: 0, output: 0 },
        tap: Tap::Tracks,
        sinks: Arc::new([]),
        placed: Arc::new([]),
    }]
}

/// Frame `seq` of "cam" at timestamp `pts`, with track `ids` on it.
fn frame(seq: u64, pts: Duration, ids: &[u64]) -> FrameResult {
    let frame = Frame::from_mat("cam".into(), seq, Some(pts), Default::default());
    let tracks: Vec<Track> = ids
        .iter()
        .map(|&track_id| Track {
            track_id,
            detection: Detection::new("person".into(), 0.9, BBOX),
            predicted: false,
            ground: None,
            speed: None,
            dwell: None,
        })
        .collect();
    let record = FrameRecord::new(Arc::new(frame), 1);
    record.set_outcome(0, Outcome::Done(vec![Value::Tracks(tracks.into())]));
    FrameResult::new(Arc::new(record))
}

fn start(dir: &std::path::Path) -> (EventStore, Storage) {
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let config = EventsConfig {
        path: dir.join("events.db"),
        retain: DEFAULT_RETAIN,
    };
    (
        EventStore::start(&config, storage.clone()).unwrap(),
        storage,
    )
}

/// The track rows: (track id, start, end).
fn track_rows(store: &EventStore) -> Vec<(i64, i64, i64)> {
    track_rows_at(&store.path)
}

#[test]
fn a_track_on_frames_delivered_seconds_apart_but_close_in_frame_time_keeps_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let (store, storage) = start(dir.path());
    store.record(&frame(0, Duration::ZERO, &[7]), &taps());
    // The next frame, half a second of the scene later, is delivered more than the 3 s that
    // end a track later (a slow step, a backlog): the writer wakes meanwhile.
    std::thread::sleep(TRACK_WAIT);
    store.record(&frame(1, Duration::from_millis(500), &[7]), &taps());
    store.stop();
    let rows = track_rows(&store);
    assert_eq!(rows.len(), 1, "one track, one row: {rows:?}");
    let (_, start, end) = rows[0];
    assert_eq!(end - start, 500, "the row lasts its frames' time: {rows:?}");
    storage.stop();
}

/// A writer of `dir/events.db` driven here batch by batch (not its thread), with its counters.
fn writer(dir: &std::path::Path) -> (writer::Writer, Arc<Counters>, Storage) {
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let config = EventsConfig {
        path: dir.join("events.db"),
        retain: DEFAULT_RETAIN,
    };
    let counters = Arc::new(Counters::default());
    let w = writer::Writer::new(config, storage.clone(), counters.clone());
    (w, counters, storage)
}

/// What the store sends the writer for `result`, which must be sent.
fn facts(result: &FrameResult) -> Facts {
    Facts::of(result, &taps()).expect("a frame the tracker ran on is sent to the writer")
}

/// The track rows of the file at `path`: (track id, start, end).
fn track_rows_at(path: &std::path::Path) -> Vec<(i64, i64, i64)> {
    let conn = schema::open_reader(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT track_id, start_ms, end_ms FROM events WHERE kind = 'track' ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn a_track_unseen_for_3_s_of_frame_time_ends_however_fast_its_frames_came() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, _, storage) = writer(dir.path());
    w.connect();
    let before = millis(SystemTime::now());
    w.write(&[facts(&frame(0, Duration::ZERO, &[7]))], false);
    assert_eq!(w.open_tracks(), 1);
    // 4 s of a file's frames without it, read in no time, each a batch of its own.
    for seq in 1..=41 {
        w.write(
            &[facts(&frame(seq, Duration::from_millis(seq * 100), &[]))],
            false,
        );
        if seq == 30 {
            assert_eq!(w.open_tracks(), 1, "unseen for 3.0 s: still open");
        }
    }
    assert_eq!(
        w.open_tracks(),
        0,
        "unseen for 3.1 s of the scene: ended, though no time passed"
    );
    w.write(
        &[facts(&frame(42, Duration::from_millis(4200), &[7]))],
        true,
    );
    let rows = track_rows_at(&dir.path().join("events.db"));
    assert_eq!(rows.len(), 2, "seen again: a new row: {rows:?}");
    assert!(rows[0].1 >= before, "{rows:?}");
    assert_eq!(rows[0].2, rows[0].1, "ends at its last sighting: {rows:?}");
    assert_eq!(rows[1].1 - rows[0].1, 4200, "rows at frame times: {rows:?}");
    storage.stop();
}

#[test]
fn a_database_deleted_between_opening_and_knowing_its_file_is_not_written_into() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let (mut w, counters, storage) = writer(dir.path());
    let before = identity::descriptors();
    let conn = schema::open_writer(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    w.adopt(conn, &before);
    w.write(&[facts(&frame(0, Duration::ZERO, &[7]))], false);
    // The writer saw that its file is gone and wrote into a new one at the path.
    let rows = track_rows_at(&path);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(counters.events.load(Ordering::Relaxed), 1);
    assert_eq!(counters.reopened.load(Ordering::Relaxed), 1);
    storage.stop();
}

#[test]
fn a_batch_committed_into_a_file_replaced_meanwhile_is_counted_as_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let other = dir.path().join("other.db");
    drop(schema::open_writer(&other).unwrap());
    let (mut w, counters, storage) = writer(dir.path());
    w.connect();
    w.write(&[facts(&frame(0, Duration::ZERO, &[7]))], false);
    assert_eq!(counters.events.load(Ordering::Relaxed), 1);
    // Between the writer's check of its file and its commit, the file is replaced.
    let aside = dir.path().join("aside.db");
    let mut once = Some((aside.clone(), other));
    w.before_commit = Some(Box::new(move |path| {
        if let Some((aside, other)) = once.take() {
            std::fs::rename(path, aside).unwrap();
            std::fs::rename(other, path).unwrap();
        }
    }));
    w.write(&[facts(&frame(1, Duration::from_millis(100), &[8]))], false);
    assert_eq!(counters.events.load(Ordering::Relaxed), 1, "not written");
    assert_eq!(counters.dropped.load(Ordering::Relaxed), 1, "dropped");
    assert_eq!(
        track_rows_at(&path),
        vec![],
        "nothing of it in the new file"
    );
    // The next batch goes into the new file, its track's row started again.
    w.write(&[facts(&frame(2, Duration::from_millis(200), &[8]))], true);
    let rows = track_rows_at(&path);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, 8);
    storage.stop();
}

/// Longer than a track is kept unseen ([`writer::TRACK_GONE`]) plus a writer's wake-up.
const TRACK_WAIT: Duration = Duration::from_millis(3000 + 2500);

/// Tracker (step 0) and a zone_count (step 1: counts, events) as the daemon taps them.
fn zone_taps() -> Vec<Output> {
    let out = |step: &str, at, tap| Output {
        step: step.into(),
        at,
        tap,
        sinks: Arc::new([]),
        placed: Arc::new([]),
    };
    vec![
        out("tracker", Ref::Step { step: 0, output: 0 }, Tap::Tracks),
        out("zones", Ref::Step { step: 1, output: 0 }, Tap::Occupancy),
        out("zones", Ref::Step { step: 1, output: 1 }, Tap::Events),
    ]
}

/// Frame `seq` of "cam" (640 x 480 at 10 fps, pts `seq` tenths of a second) with a seen track
/// standing at (330, 250), a predicted one elsewhere, `inside` objects in zone "door" and
/// `events`.
fn zone_frame(seq: u64, inside: u64, events: Vec<Event>) -> FrameResult {
    use opencv::core::{CV_8UC3, Mat, Scalar};
    let mat = Mat::new_rows_cols_with_default(480, 640, CV_8UC3, Scalar::all(0.0)).unwrap();
    let mut frame = Frame::from_mat(
        "cam".into(),
        seq,
        Some(Duration::from_millis(seq * 100)),
        mat,
    );
    frame.fps = Some((10, 1));
    let seen = BBox {
        x: 310.0,
        y: 200.0,
        width: 40.0,
        height: 50.0,
    };
    let tracks = vec![
        Track::new(1, Detection::new("person".into(), 0.9, seen), false),
        Track::new(2, Detection::new("person".into(), 0.9, BBOX), true),
    ];
    let counts = crate::value::Counts([("door".into(), inside)].into_iter().collect());
    let record = FrameRecord::new(Arc::new(frame), 2);
    record.set_outcome(0, Outcome::Done(vec![Value::Tracks(tracks.into())]));
    record.set_outcome(
        1,
        Outcome::Done(vec![
            Value::Counts(Arc::new(counts)),
            Value::Events(events.into()),
        ]),
    );
    FrameResult::new(Arc::new(record))
}

#[test]
fn a_tracker_fed_by_a_resized_copy_heats_the_frames_cells_where_its_boxes_are() {
    use crate::frame::Placement;
    let dir = tempfile::tempdir().unwrap();
    let (store, _storage) = start(dir.path());
    // The tracker ran on a copy of twice the frame's size: its box standing at (330, 250)
    // stands at (165, 125) on the 640 x 480 frame, a quarter of a cell from the centre of
    // column 8, row 6 (20 px a cell, centres at 10 + 20 k).
    let mut taps = zone_taps();
    taps[0].placed = Arc::new([Placement::Scaled {
        width: 1280,
        height: 960,
    }]);
    for seq in 0..10 {
        store.record(&zone_frame(seq, 1, Vec::new()), &taps);
    }
    store.stop();
    let map = zones::heatmap(&store.path, &zones::HeatFilter::default()).unwrap();
    let at = |row: usize, col: usize| map.seconds[row * 32 + col];
    assert!((map.total_s - 1.0).abs() < 1e-5, "{}", map.total_s);
    assert!((at(6, 8) - 0.5625).abs() < 1e-5, "{:?}", at(6, 8));
    assert!((at(5, 7) - 0.0625).abs() < 1e-5, "{:?}", at(5, 7));
    assert_eq!(at(12, 16), 0.0, "the copy's pixels taken for the frame's");
}

#[test]
fn occupancy_is_the_time_weighted_mean_inside_and_heat_the_seconds_seen_at_each_cell() {
    use crate::value::{EventKind, Speed};
    let dir = tempfile::tempdir().unwrap();
    let (store, storage) = start(dir.path());
    let event = |kind, dwell: f32, speed| {
        let mut e = Event::new(kind, 1, "person".into(), "door".into(), BBOX);
        e.dwell_s = Some(dwell);
        e.speed = speed;
        e
    };
    // 10 frames of 0.1 s: 3 inside for the first 5, 1 for the last 5.
    for seq in 0..10 {
        let events = if seq == 9 {
            vec![
                event(EventKind::Leave, 4.5, None),
                event(EventKind::Loiter, 30.0, None),
                event(EventKind::Speeding, 2.0, Some(Speed::Kmh(42.0))),
            ]
        } else {
            Vec::new()
        };
        let inside = if seq < 5 { 3 } else { 1 };
        store.record(&zone_frame(seq, inside, events), &zone_taps());
    }
    store.stop();
    let conn = schema::open_reader(&store.path).unwrap();
    let (object_s, seconds, max): (f64, f64, i64) = conn
        .query_row(
            "SELECT sum(object_s), sum(seconds), max(max) FROM occupancy
             WHERE source = 'cam' AND step = 'zones' AND place = 'door'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(
        (seconds - 1.0).abs() < 1e-6,
        "10 frames of 0.1 s: {seconds}"
    );
    assert!(
        (object_s - 2.0).abs() < 1e-6,
        "3 x 0.5 s + 1 x 0.5 s: {object_s}"
    );
    assert_eq!(max, 3);

    let all = zones::HeatFilter::default();
    let map = zones::heatmap(&store.path, &all).unwrap();
    assert_eq!(
        (map.cols, map.rows, map.width, map.height),
        (32, 24, 640, 480)
    );
    // Only the seen track, standing at (330, 250): column 16, row 12; every frame 0.1 s.
    let busy: Vec<(usize, f32)> = map
        .seconds
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, s)| *s > 0.0)
        .collect();
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0].0, 12 * 32 + 16);
    assert!((busy[0].1 - 1.0).abs() < 1e-5, "{busy:?}");
    assert!((map.total_s - 1.0).abs() < 1e-5);

    // The events keep their dwell and speed; the zone's summary reads them.
    let by_kind = |kind: &str| {
        conn.query_row(
            "SELECT dwell_s, speed, speed_unit FROM events WHERE kind = ?1",
            [kind],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    let leave: (Option<f64>, Option<f64>, Option<String>) = by_kind("leave");
    assert_eq!(leave, (Some(4.5), None, None));
    let speeding: (Option<f64>, Option<f64>, Option<String>) = by_kind("speeding");
    assert_eq!(speeding, (Some(2.0), Some(42.0), Some("km/h".to_owned())));
    let day = zones::ZoneFilter::from_pairs(&[("bucket".into(), "day".into())]).unwrap();
    let rows = zones::zones(&store.path, &day).unwrap();
    let total = |f: fn(&zones::ZoneRow) -> i64| rows.iter().map(f).sum::<i64>();
    assert_eq!(total(|r| r.leaves), 1, "{rows:?}");
    assert_eq!(total(|r| r.visits), 1);
    assert_eq!(total(|r| r.loiter), 1);
    assert_eq!(total(|r| r.speeding), 1);
    let visited = rows.iter().find(|r| r.visits == 1).unwrap();
    assert_eq!(visited.dwell_s.as_ref().unwrap().p90, 4.5);
    storage.stop();
}

#[test]
fn a_version_1_database_is_brought_to_version_2_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(schema::MIGRATION_1).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO events (start_ms, end_ms, source, kind, place) VALUES (5, 6, 'cam', 'leave', 'door')",
            [],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO counts (source, step, place, name, minute, n) VALUES ('cam', 'z', 'door', 'leave', 0, 3)",
            [],
        )
        .unwrap();
    }
    let conn = schema::open_writer(&path).unwrap();
    let v: u32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(v, schema::VERSION);
    drop(conn);
    let all = query::EventFilter {
        limit: 10,
        ..query::EventFilter::default()
    };
    let rows = query::events(&path, &all).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].start, rows[0].dwell_s), (5, None));
    let day = zones::ZoneFilter::from_pairs(&[("bucket".into(), "day".into())]).unwrap();
    let z = zones::zones(&path, &day).unwrap();
    assert_eq!((z.len(), z[0].leaves, z[0].visits), (1, 1, 0));
    let n: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT n FROM counts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
}
