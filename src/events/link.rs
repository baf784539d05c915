//! Which snapshot and clip show an event: a file is an event's when the sink that made it
//! reads the event's step in its `when` (so it was made because of such events), it was made
//! for the event's frame (a snapshot of that frame, a clip that frame triggered or extended),
//! and it shows the whole picture or the event's own object (a crop around its track), as the
//! sink told the storage (`storage::Writing::made_for`). Never by time alone: two sinks on one
//! source, or a snapshot of the frame before, are not the event's; nor by frame alone: of two
//! people crossing on one frame, each gets the crop of its own.

use std::sync::Arc;
use std::time::Instant;

use rusqlite::{Connection, params};

use crate::storage::{Shows, StoredFile};

/// An event row that sinks make files for, until both are named or [`super::writer`] gives up
/// on it (`LINK_WINDOW`).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) row: i64,
    /// Its row's `start_ms`: with its id and source, how a reopened file is known to hold it.
    pub(super) start: i64,
    pub(super) source: Arc<str>,
    /// The number of the frame it happened on.
    pub(super) frame: u64,
    /// The track it happened to: a crop of another track on its frame is not its.
    pub(super) track: u64,
    /// The sinks whose `when` reads its step.
    pub(super) sinks: Arc<[Arc<str>]>,
    pub(super) since: Instant,
    pub(super) snapshot: bool,
    pub(super) clip: bool,
}

impl Pending {
    /// Whether `f` was made for this event by one of its sinks.
    fn made_for_it(&self, f: &StoredFile) -> bool {
        f.source == self.source
            && self.sinks.contains(&f.sink)
            && f.made_for
                .is_some_and(|(first, last)| (first..=last).contains(&self.frame))
            && match f.shows {
                Shows::Frame => true,
                Shows::Object(track) => track == Some(self.track),
            }
    }

    fn done(&self) -> bool {
        self.snapshot && self.clip
    }
}

/// Names, in one transaction, the snapshot and clip of each `pending` event that has one among
/// `files` now (a clip once finished), and forgets the events that have both.
pub(super) fn link(
    conn: &Connection,
    files: &[StoredFile],
    pending: &mut Vec<Pending>,
) -> rusqlite::Result<()> {
    let mut found = Vec::new();
    for (i, p) in pending.iter().enumerate() {
        let mine = || files.iter().filter(|f| p.made_for_it(f));
        let snapshot = (!p.snapshot)
            .then(|| mine().find(|f| has_extension(f, "jpg")))
            .flatten();
        let clip = (!p.clip)
            .then(|| mine().find(|f| has_extension(f, "mp4") && f.closed.is_some()))
            .flatten();
        if snapshot.is_some() || clip.is_some() {
            found.push((i, snapshot, clip));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    for (i, snapshot, clip) in &found {
        let row = pending[*i].row;
        for (column, file) in [("snapshot", snapshot), ("clip", clip)] {
            if let Some(f) = file {
                tx.execute(
                    &format!("UPDATE events SET {column} = ?1 WHERE id = ?2"),
                    params![f.path.to_string_lossy(), row],
                )?;
            }
        }
    }
    tx.commit()?;
    for (i, snapshot, clip) in found {
        pending[i].snapshot |= snapshot.is_some();
        pending[i].clip |= clip.is_some();
    }
    pending.retain(|p| !p.done());
    Ok(())
}

fn has_extension(f: &StoredFile, ext: &str) -> bool {
    f.path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::SystemTime;

    use super::*;
    use crate::storage::Class;

    fn file(name: &str, sink: &str, frame: u64, shows: Shows) -> StoredFile {
        StoredFile {
            path: PathBuf::from(name),
            sink: sink.into(),
            source: "cam".into(),
            class: Class::Event,
            created: SystemTime::UNIX_EPOCH,
            closed: Some(SystemTime::UNIX_EPOCH),
            bytes: 1,
            made_for: Some((frame, frame)),
            shows,
        }
    }

    fn pending(row: i64, track: u64, sink: &str) -> Pending {
        Pending {
            row,
            start: 0,
            source: "cam".into(),
            frame: 7,
            track,
            sinks: Arc::from([Arc::<str>::from(sink)]),
            since: Instant::now(),
            snapshot: false,
            clip: false,
        }
    }

    fn snapshots(conn: &Connection) -> Vec<Option<String>> {
        let mut stmt = conn
            .prepare("SELECT snapshot FROM events ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn two_events_of_one_frame_each_get_the_crop_of_their_own_track_and_both_the_whole_frame() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE events (id INTEGER PRIMARY KEY, snapshot TEXT, clip TEXT);
             INSERT INTO events (id) VALUES (1), (2), (3), (4);",
        )
        .unwrap();
        let files = [
            file("crop-of-none.jpg", "crops", 7, Shows::Object(None)),
            file("crop-of-2.jpg", "crops", 7, Shows::Object(Some(2))),
            file("crop-of-1.jpg", "crops", 7, Shows::Object(Some(1))),
            file("crop-of-1-before.jpg", "crops", 6, Shows::Object(Some(1))),
            // Nothing said of what it shows (a file of a sink that says only its frames).
            file("whole.jpg", "whole", 7, Shows::default()),
        ];
        let mut pending = vec![
            pending(1, 1, "crops"),
            pending(2, 2, "crops"),
            pending(3, 1, "whole"),
            pending(4, 2, "whole"),
        ];
        link(&conn, &files, &mut pending).unwrap();
        assert_eq!(
            snapshots(&conn),
            [
                Some("crop-of-1.jpg".to_owned()),
                Some("crop-of-2.jpg".to_owned()),
                Some("whole.jpg".to_owned()),
                Some("whole.jpg".to_owned()),
            ]
        );
    }
}
