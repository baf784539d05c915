//! The API's handlers of events, counts, sources, health and kept files (the routes of
//! `routes.rs`; recordings in `recordings.rs`, zones and heatmaps in `heatmap.rs`). Each reads
//! its [`Call`] and gives an [`Answer`] (`answer.rs`).

use std::path::Path;

use serde_json::json;

use super::answer::{Answer, Call, failed, json_answer, page_answer, store, text};
use crate::daemon::live::Parts;
use crate::events::query::{self, CountFilter, EventFilter, EventRow, QueryError};

pub(super) fn sources(c: &Call<'_>) -> Answer {
    json_answer(200, &super::pages::sources(&c.shared.live))
}

pub(super) fn health(c: &Call<'_>) -> Answer {
    json_answer(200, &super::pages::health(&c.shared.live, c.parts))
}

pub(super) fn events(c: &Call<'_>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    match EventFilter::from_pairs(&c.pairs)
        .map_err(QueryError::from)
        .and_then(|f| query::events(&db, &f))
    {
        Ok(rows) => json_answer(
            200,
            &serde_json::Value::Array(rows.iter().map(event_json).collect()),
        ),
        Err(e) => failed(&e),
    }
}

pub(super) fn counts(c: &Call<'_>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    match CountFilter::from_pairs(&c.pairs)
        .map_err(QueryError::from)
        .and_then(|f| query::counts(&db, &f))
    {
        Ok(page) => page_answer(
            "counts",
            json!(page.rows),
            page.next.map(|c| query::cursor(&c)),
            &c.pairs,
        ),
        Err(e) => failed(&e),
    }
}

/// An event's files.
#[derive(Clone, Copy)]
enum EventFile {
    Snapshot,
    Clip,
}

pub(super) fn event(c: &Call<'_>) -> Answer {
    one_event(c, None)
}

pub(super) fn snapshot(c: &Call<'_>) -> Answer {
    one_event(c, Some(EventFile::Snapshot))
}

pub(super) fn clip(c: &Call<'_>) -> Answer {
    one_event(c, Some(EventFile::Clip))
}

/// An event as the API returns it: its row, with the URLs of its snapshot and clip (relative,
/// so that they work under a reverse proxy's sub-path) when it has them.
fn event_json(e: &EventRow) -> serde_json::Value {
    let mut v = json!(e);
    if let Some(map) = v.as_object_mut() {
        let url = |has: bool, file: &str| {
            has.then(|| format!("api/events/{}/{file}", e.id))
                .map_or(serde_json::Value::Null, serde_json::Value::String)
        };
        map.insert(
            "snapshot_url".into(),
            url(e.snapshot.is_some(), "snapshot.jpg"),
        );
        map.insert("clip_url".into(), url(e.clip.is_some(), "clip.mp4"));
    }
    v
}

fn one_event(c: &Call<'_>, file: Option<EventFile>) -> Answer {
    let db = match store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    let id = c.args.first().copied().unwrap_or_default();
    let Ok(id) = id.parse::<i64>() else {
        return text(400, &format!("event id \"{id}\" is not a whole number"));
    };
    let row = match query::event(&db, id) {
        Ok(Some(row)) => row,
        Ok(None) => return text(404, &format!("no event {id}")),
        Err(e) => return failed(&e),
    };
    let wanted = match file {
        None => return json_answer(200, &event_json(&row)),
        Some(EventFile::Snapshot) => row.snapshot.as_deref(),
        Some(EventFile::Clip) => row.clip.as_deref(),
    };
    match wanted {
        Some(path) => kept(c.parts, Path::new(path)),
        None => text(404, &format!("event {id} has no such file")),
    }
}

/// The file, if the storage lists it (vidflow wrote it and has not deleted it); else 404.
fn kept(parts: &Parts, path: &Path) -> Answer {
    match &parts.storage {
        Some(storage) if storage.lists(path) => Answer::File(path.to_owned()),
        _ => text(
            404,
            "no such file among those vidflow wrote (deleted by retention, or never written)",
        ),
    }
}

/// The id of a kept file's path in its URL: the first 64 bits of the SHA-256 of the whole path
/// as written (its folders too), in hex. The same path has the same id in every run, so a
/// link stays good across restarts; files of one name in two folders (two cameras' segments
/// cut at the same second) have two. Only a kept file is ever looked up by it, so it needs no
/// path checks: nothing from the URL is joined to a folder.
pub(super) fn media_id(path: &Path) -> String {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let digest = sha2::Sha256::digest(path.as_os_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn media(c: &Call<'_>) -> Answer {
    let (parts, [sink, id, name]) = (c.parts, c.args.as_slice()) else {
        return text(
            404,
            "a file's URL is api/media/SINK/ID/NAME, as /api/recordings gives it",
        );
    };
    let (Some(sink), Some(name)) = (
        crate::spec::percent_decode(sink),
        crate::spec::percent_decode(name),
    ) else {
        return text(400, "bad percent-encoding");
    };
    let found = parts
        .storage
        .as_ref()
        .and_then(|s| s.find(&sink, &name, |path| media_id(path) == *id));
    match found {
        Some(f) => Answer::File(f.path),
        None => text(
            404,
            &format!("no file \"{name}\" ({id}) of sink \"{sink}\" among those vidflow wrote"),
        ),
    }
}
