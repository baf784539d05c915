//! The cameras' pictures on the live stream: with `?stills=1`, `/api/live` also carries each
//! source's newest preview JPEG as an `event: still` (data: `{"source", "jpeg"}`, the JPEG in
//! base64), so that a page shows every camera over its one live connection, not over an MJPEG
//! connection per camera: a browser opens at most six connections per host (HTTP/1.1), and a
//! page of six cameras would take them all, leaving none for its API requests.
//!
//! Runs on the live thread (`live.rs`), which calls [`Watches::pass`] at each of its wake-ups
//! (at least every [`STILL_TICK`] while a client asks for stills): it then holds a [`Watch`] on
//! the preview channel of each source such a client follows and a `preview` sink takes (so the
//! sink encodes only then, at its own `max_fps`, as for `/preview/SOURCE`), and at most once
//! per [`STILL_TICK`] takes each source's JPEG newer than the last it took and makes its
//! message once. A client keeps at most one still per source that it has not been sent
//! ([`Slots`]): a newer one takes its place, and the one replaced is counted
//! (`Feed::stills_dropped`). A still goes into a client's buffer only once its socket took
//! everything before it (`live::Client::flush`), so a client that reads slowly gets fewer
//! stills, never a longer queue: it holds its frames' messages (`live::CLIENT_BUFFER`), the still
//! being sent and one waiting per source.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::Live;
use crate::sinks::preview::{Watch, hub};

/// Least time between two stills of a source on the live stream (at most 10 a second; the
/// preview sink's `max_fps`, 5 by default, is usually lower).
pub(super) const STILL_TICK: Duration = Duration::from_millis(100);

/// `stills=1` in `target`'s query: whether the client asks for stills; `Err` with the 400's
/// message for another value.
pub(super) fn asked(target: &str) -> Result<bool, String> {
    let pairs = super::answer::pairs(target).map_err(|e| e.0)?;
    match pairs.iter().rev().find(|(k, _)| k == "stills") {
        None => Ok(false),
        Some((_, v)) if v == "1" => Ok(true),
        Some((_, v)) if v == "0" => Ok(false),
        Some((_, v)) => Err(format!("stills must be 0 or 1, not \"{v}\"\n")),
    }
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
    /// source it follows, `None` for every source) and, once per [`STILL_TICK`], takes their new
    /// JPEGs; each new still's source and message.
    pub(super) fn pass<'a>(
        &mut self,
        live: &Live,
        followed: impl Iterator<Item = Option<&'a str>>,
    ) -> Vec<(Arc<str>, Arc<[u8]>)> {
        let mut named = BTreeSet::new();
        let (mut asked, mut all) = (false, false);
        for source in followed {
            asked = true;
            match source {
                Some(s) => drop(named.insert(s)),
                None => all = true,
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

/// A still's Server-Sent Event.
fn message(source: &str, jpeg: &[u8]) -> Arc<[u8]> {
    let data = serde_json::json!({
        "source": source,
        "jpeg": base64::engine::general_purpose::STANDARD.encode(jpeg),
    });
    format!("event: still\ndata: {data}\n\n")
        .into_bytes()
        .into()
}

/// A client's stills not sent yet: at most one per source, oldest first.
#[derive(Debug, Default)]
pub(super) struct Slots(VecDeque<(Arc<str>, Arc<[u8]>)>);

impl Slots {
    /// Keeps `message` as the still of `source` to send next; `true` when it replaced one that
    /// was never sent (which is dropped).
    pub(super) fn offer(&mut self, source: &Arc<str>, message: &Arc<[u8]>) -> bool {
        if let Some((_, waiting)) = self.0.iter_mut().find(|(s, _)| s == source) {
            *waiting = message.clone();
            return true;
        }
        self.0.push_back((source.clone(), message.clone()));
        false
    }

    /// The still that has waited longest (its source's newest).
    pub(super) fn next(&mut self) -> Option<Arc<[u8]>> {
        self.0.pop_front().map(|(_, message)| message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_still_takes_the_place_of_one_not_sent_and_the_sources_take_turns() {
        let mut slots = Slots::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let still = |text: &str| -> Arc<[u8]> { text.as_bytes().into() };
        assert!(!slots.offer(&a, &still("a1")));
        assert!(!slots.offer(&b, &still("b1")));
        for n in 2..100 {
            assert!(
                slots.offer(&a, &still(&format!("a{n}"))),
                "a{n} replaced none"
            );
        }
        assert_eq!(slots.0.len(), 2, "one still waits per source");
        assert_eq!(slots.next().as_deref(), Some(&b"a99"[..]));
        assert_eq!(slots.next().as_deref(), Some(&b"b1"[..]));
        assert_eq!(slots.next(), None);
    }

    #[test]
    fn stills_are_asked_for_with_1_and_another_value_is_refused() {
        assert_eq!(asked("/api/live"), Ok(false));
        assert_eq!(asked("/api/live?stills=1"), Ok(true));
        assert_eq!(asked("/api/live/cam?stills=0"), Ok(false));
        assert_eq!(
            asked("/api/live?stills=yes"),
            Err("stills must be 0 or 1, not \"yes\"\n".to_owned())
        );
    }

    #[test]
    fn a_still_is_a_server_sent_event_with_the_jpeg_in_base64() {
        let m = message("cam \"1\"", &[0xff, 0xd8, 0xff]);
        assert_eq!(
            std::str::from_utf8(&m).unwrap(),
            "event: still\ndata: {\"source\":\"cam \\\"1\\\"\",\"jpeg\":\"/9j/\"}\n\n"
        );
    }
}
