//! The cameras' pictures on the live stream: with `?stills=1`, `/api/live` also carries each
//! source's newest preview JPEG as `event: still` messages (data: `{"source", "jpeg"}`, the
//! JPEG in base64, in parts of at most [`STILL_PART`] bytes: every part but the last also has
//! `"more": true`, and the page joins a source's parts' `jpeg` in order), so that a page shows every camera over its one live connection, not over an MJPEG
//! connection per camera: a browser opens at most six connections per host (HTTP/1.1), and a
//! page of six cameras would take them all, leaving none for its API requests.
//!
//! Runs on the live thread (`live.rs`), which calls [`Watches::pass`] at each of its wake-ups
//! (at least every [`STILL_TICK`] while a client asks for stills): it then holds a [`Watch`] on
//! the preview channel of each source such a client follows and a `preview` sink takes (so the
//! sink encodes only then, at its own `max_fps`, as for `/preview/SOURCE`), and at most once
//! per [`STILL_TICK`] takes each source's JPEG newer than the last it took and makes its
//! message once, shared by every client (never copied whole into a client's buffer). A client
//! keeps at most one still per source that it has not begun ([`Slots`]): a newer one takes its
//! place, and the one replaced is counted (`Feed::stills_dropped`). A still's part goes into a
//! client's buffer only once its socket took everything before it (`live::Client::flush`), and
//! counts in its budget (`live::CLIENT_BUFFER`) like its frames' messages: a client that reads
//! slowly gets fewer stills, never a longer queue, and its frames wait behind one part of a
//! still at most, never behind a whole 4K picture (about 1.3 MB in base64). A 1024-pixel-wide
//! JPEG is about 100 KB, so a few parts.
//!
//! `stills_of=a,b` asks for those sources' stills only: the page plays the cameras that have
//! H.264 as video (`video/`) and asks stills of the others, so that no `preview` sink encodes
//! JPEGs for a camera it shows as video.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::Live;
use crate::sinks::preview::{Watch, hub};

/// Least time between two stills of a source on the live stream (at most 10 a second; the
/// preview sink's `max_fps`, 5 by default, is usually lower).
pub(super) const STILL_TICK: Duration = Duration::from_millis(100);
/// Bytes of base64 in one part of a still: frames wait behind one part at most (a few
/// milliseconds on a link of some Mbit/s), and a still of a few parts costs a few messages.
pub(super) const STILL_PART: usize = 32 * 1024;

/// A still's messages, in order: each a whole Server-Sent Event, shared between the clients.
pub(super) type Still = Arc<[Arc<[u8]>]>;

/// What a live client asked for: the stills (`stills=1`), of some sources only
/// (`stills_of=a,b`, which implies `stills=1`), the frames' boxes (unless `frames=0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Asked {
    pub stills: bool,
    /// The sources whose stills it takes; `None`: every source it follows.
    pub stills_of: Option<BTreeSet<String>>,
    pub frames: bool,
}

/// `stills=1`, `stills_of=a,b` and `frames=0` in `target`'s query: what the client asks for;
/// `Err` with the 400's message for another value. A name in `stills_of` that is no source's
/// is kept: the source may come with a reload (a page asks for what it shows as stills).
pub(super) fn asked(target: &str) -> Result<Asked, String> {
    let pairs = super::answer::pairs(target).map_err(|e| e.0)?;
    let last = |key: &str| pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v);
    let flag = |key: &str, default: bool| match last(key) {
        None => Ok(default),
        Some(v) if v == "1" => Ok(true),
        Some(v) if v == "0" => Ok(false),
        Some(v) => Err(format!("{key} must be 0 or 1, not \"{v}\"\n")),
    };
    let stills_of = match last("stills_of") {
        None => None,
        Some(list) => Some(names(list)?),
    };
    Ok(Asked {
        stills: stills_of.is_some() || flag("stills", false)?,
        stills_of,
        frames: flag("frames", true)?,
    })
}

/// A comma-separated list of source names (empty: none).
fn names(list: &str) -> Result<BTreeSet<String>, String> {
    let valid = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    list.split(',')
        .filter(|n| !list.is_empty() || !n.is_empty())
        .map(|n| {
            valid(n)
                .then(|| n.to_owned())
                .ok_or_else(|| format!("stills_of must list source names, not \"{n}\"\n"))
        })
        .collect()
}

/// The preview channels the live thread watches while a client asks for stills.
#[derive(Debug, Default)]
pub(super) struct Watches {
    by_source: Vec<(Arc<str>, Watch)>,
    /// Whether a client asked for stills at the last pass.
    asked: bool,
    /// When the last pass took the JPEGs.
    taken: Option<Instant>,
}

impl Watches {
    /// How long the live thread may wait for something else before the next pass.
    pub(super) fn wait(&self, otherwise: Duration) -> Duration {
        if self.asked { STILL_TICK } else { otherwise }
    }

    /// Watches the sources `followed` names (one entry per client that asks for stills: the
    /// source it follows, `None` for every source, and the sources it takes the stills of,
    /// `None` for all it follows) and, once per [`STILL_TICK`], takes their new JPEGs; each new
    /// still's source and message.
    pub(super) fn pass<'a>(
        &mut self,
        live: &Live,
        followed: impl Iterator<Item = (Option<&'a str>, Option<&'a BTreeSet<String>>)>,
    ) -> Vec<(Arc<str>, Still)> {
        let mut named = BTreeSet::new();
        let (mut asked, mut all) = (false, false);
        for (source, of) in followed {
            asked = true;
            match (source, of) {
                (Some(s), of) if of.is_none_or(|o| o.contains(s)) => drop(named.insert(s)),
                (Some(_), _) => {}
                (None, Some(of)) => named.extend(of.iter().map(String::as_str)),
                (None, None) => all = true,
            }
        }
        self.asked = asked;
        if !asked {
            self.by_source.clear();
            return Vec::new();
        }
        if self.taken.is_some_and(|t| t.elapsed() < STILL_TICK) {
            return Vec::new();
        }
        self.taken = Some(Instant::now());
        let parts = live.parts();
        let wanted: Vec<&Arc<str>> = parts
            .sources
            .iter()
            .map(|s| &s.name)
            .filter(|n| (all || named.contains(&***n)) && super::preview::available(&parts, n))
            .collect();
        self.by_source.retain(|(s, _)| wanted.contains(&s));
        for name in wanted {
            if !self.by_source.iter().any(|(s, _)| s == name) {
                self.by_source
                    .push((name.clone(), hub().channel(name).watch()));
            }
        }
        self.by_source
            .iter_mut()
            .filter_map(|(s, w)| Some((s.clone(), message(s, &w.try_next()?))))
            .collect()
    }
}

/// A still's Server-Sent Events: its base64 in parts of [`STILL_PART`] bytes.
fn message(source: &str, jpeg: &[u8]) -> Still {
    let base64 = base64::engine::general_purpose::STANDARD.encode(jpeg);
    let parts: Vec<&str> = if base64.is_empty() {
        vec![""]
    } else {
        // Base64 is ASCII: every byte is a character boundary.
        base64
            .as_bytes()
            .chunks(STILL_PART)
            .filter_map(|c| std::str::from_utf8(c).ok())
            .collect()
    };
    let last = parts.len() - 1;
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let data = if i < last {
                serde_json::json!({ "source": source, "jpeg": part, "more": true })
            } else {
                serde_json::json!({ "source": source, "jpeg": part })
            };
            format!("event: still\ndata: {data}\n\n")
                .into_bytes()
                .into()
        })
        .collect()
}

/// A client's stills not sent yet: at most one per source, oldest first.
#[derive(Debug, Default)]
pub(super) struct Slots(VecDeque<(Arc<str>, Still)>);

impl Slots {
    /// Keeps `message` as the still of `source` to send next; `true` when it replaced one that
    /// was never sent (which is dropped).
    pub(super) fn offer(&mut self, source: &Arc<str>, message: &Still) -> bool {
        if let Some((_, waiting)) = self.0.iter_mut().find(|(s, _)| s == source) {
            *waiting = message.clone();
            return true;
        }
        self.0.push_back((source.clone(), message.clone()));
        false
    }

    /// The still that has waited longest (its source's newest).
    pub(super) fn next(&mut self) -> Option<Still> {
        self.0.pop_front().map(|(_, message)| message)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A still's messages, for the live thread's tests.
    pub(in crate::daemon::http) fn message_of(source: &str, jpeg: &[u8]) -> Still {
        message(source, jpeg)
    }

    #[test]
    fn a_newer_still_takes_the_place_of_one_not_sent_and_the_sources_take_turns() {
        let mut slots = Slots::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let still = |text: &str| -> Still { vec![Arc::from(text.as_bytes())].into() };
        assert!(!slots.offer(&a, &still("a1")));
        assert!(!slots.offer(&b, &still("b1")));
        for n in 2..100 {
            assert!(
                slots.offer(&a, &still(&format!("a{n}"))),
                "a{n} replaced none"
            );
        }
        assert_eq!(slots.0.len(), 2, "one still waits per source");
        assert_eq!(slots.next(), Some(still("a99")));
        assert_eq!(slots.next(), Some(still("b1")));
        assert_eq!(slots.next(), None);
    }

    #[test]
    fn stills_are_asked_for_all_or_some_sources_and_another_value_is_refused() {
        let asked_for = |stills, frames| {
            Ok(Asked {
                stills,
                stills_of: None,
                frames,
            })
        };
        assert_eq!(asked("/api/live"), asked_for(false, true));
        assert_eq!(asked("/api/live?stills=1"), asked_for(true, true));
        assert_eq!(asked("/api/live/cam?stills=0"), asked_for(false, true));
        assert_eq!(asked("/api/live?stills=1&frames=0"), asked_for(true, false));
        assert_eq!(
            asked("/api/live?stills=yes"),
            Err("stills must be 0 or 1, not \"yes\"\n".to_owned())
        );
        assert_eq!(
            asked("/api/live?frames=no"),
            Err("frames must be 0 or 1, not \"no\"\n".to_owned())
        );
        let of = |names: &[&str]| Some(names.iter().map(|n| (*n).to_owned()).collect());
        let stills_of = |names: &[&str]| {
            Ok(Asked {
                stills: true,
                stills_of: of(names),
                frames: true,
            })
        };
        assert_eq!(
            asked("/api/live?stills_of=a,cam-2"),
            stills_of(&["a", "cam-2"])
        );
        assert_eq!(asked("/api/live?stills_of="), stills_of(&[]));
        assert_eq!(
            asked("/api/live?stills_of=a,,b"),
            Err("stills_of must list source names, not \"\"\n".to_owned())
        );
    }

    #[test]
    fn a_still_is_a_server_sent_event_with_the_jpeg_in_base64() {
        let m = message("cam \"1\"", &[0xff, 0xd8, 0xff]);
        assert_eq!(m.len(), 1);
        assert_eq!(
            std::str::from_utf8(&m[0]).unwrap(),
            "event: still\ndata: {\"source\":\"cam \\\"1\\\"\",\"jpeg\":\"/9j/\"}\n\n"
        );
    }

    #[test]
    fn a_big_still_goes_in_parts_that_join_into_its_base64() {
        let jpeg: Vec<u8> = (0..100_000u32).map(|n| (n % 251) as u8).collect();
        let m = message("cam", &jpeg);
        assert_eq!(
            m.len(),
            5,
            "133,336 bytes of base64 in parts of {STILL_PART}"
        );
        let mut joined = String::new();
        for (i, part) in m.iter().enumerate() {
            let text = std::str::from_utf8(part).unwrap();
            let data = text.strip_prefix("event: still\ndata: ").unwrap();
            let data: serde_json::Value = serde_json::from_str(data.trim_end()).unwrap();
            assert_eq!(data["source"], "cam");
            assert_eq!(data["more"].as_bool(), (i + 1 < m.len()).then_some(true));
            let jpeg = data["jpeg"].as_str().unwrap();
            assert!(jpeg.len() <= STILL_PART);
            joined.push_str(jpeg);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(joined)
            .unwrap();
        assert_eq!(decoded, jpeg);
    }
}
