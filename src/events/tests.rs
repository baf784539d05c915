//! The store on a real SQLite file, fed through [`EventStore::record`] as the executor feeds
//! it: frames made here with the timestamps a source gives (the point is their timing).

use std::sync::Arc;
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
    let conn = schema::open_reader(&store.path).unwrap();
    let mut stmt = conn
        .prepare("SELECT track_id, start_ms, end_ms FROM events WHERE kind = 'track' ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
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

#[test]
fn a_track_unseen_for_3_s_of_frame_time_ends_however_fast_its_frames_came() {
    let dir = tempfile::tempdir().unwrap();
    let (store, storage) = start(dir.path());
    let before = millis(SystemTime::now());
    store.record(&frame(0, Duration::ZERO, &[7]), &taps());
    // 4 s of a file's frames without it, read in no time.
    for seq in 1..=41 {
        let r = frame(seq, Duration::from_millis(seq * 100), &[]);
        store.record(&r, &taps());
    }
    store.record(&frame(42, Duration::from_millis(4200), &[7]), &taps());
    store.stop();
    let rows = track_rows(&store);
    assert_eq!(
        rows.len(),
        2,
        "gone for 4 s of the scene: a new row: {rows:?}"
    );
    assert!(rows[0].1 >= before, "{rows:?}");
    assert_eq!(rows[1].1 - rows[0].1, 4200, "rows at frame times: {rows:?}");
    storage.stop();
}

/// Longer than a track is kept unseen ([`writer::TRACK_GONE`]) plus a writer's wake-up.
const TRACK_WAIT: Duration = Duration::from_millis(3000 + 2500);
