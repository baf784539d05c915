//! What an API route's handler gets and gives (`routes.rs` names the handlers, `api.rs` calls
//! them): the request ([`Call`]), the answer ([`Answer`]) and the ways every handler answers
//! (JSON, a page with its `Link`, a text error, a failed query) and reads the query's pairs.
//! Apart from the dispatcher (`api.rs`) and the handlers, so that each imports it and neither
//! the other.

use std::path::PathBuf;

use serde_json::json;

use super::Shared;
use super::response;
use crate::daemon::live::Parts;
use crate::events::query::{BadParam, QueryError};

/// What a route answers.
pub(super) enum Answer {
    Bytes(Vec<u8>),
    File(std::path::PathBuf),
}

/// A request, as a route's handler (`routes::ROUTES`) gets it.
pub(super) struct Call<'a> {
    pub shared: &'a Shared,
    pub parts: &'a Parts,
    /// The path's `{name}` segments, in order, as sent (percent-encoded).
    pub args: Vec<&'a str>,
    /// The query's pairs, percent-decoded; only keys the route takes.
    pub pairs: Vec<(String, String)>,
}

pub(super) fn json_answer(status: u16, value: &serde_json::Value) -> Answer {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Answer::Bytes(response(status, "application/json", &body, ""))
}

/// A page of `items` of the route `name` (`counts`, `recordings`): `{name: items, "next":
/// cursor}`, and while more remain, a `Link` to the next page: this request's query with the
/// cursor (relative, so that it works under a reverse proxy's sub-path).
pub(super) fn page_answer(
    name: &str,
    items: serde_json::Value,
    next: Option<String>,
    pairs: &[(String, String)],
) -> Answer {
    let link = next.as_deref().map_or_else(String::new, |cursor| {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let query: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k != "cursor")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain([("cursor", cursor)])
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect();
        format!("Link: <{name}?{}>; rel=\"next\"\r\n", query.join("&"))
    });
    let body = serde_json::to_vec(&json!({ name: items, "next": next })).unwrap_or_default();
    Answer::Bytes(response(200, "application/json", &body, &link))
}

pub(super) fn text(status: u16, message: &str) -> Answer {
    Answer::Bytes(response(
        status,
        "text/plain; charset=utf-8",
        format!("{message}\n").as_bytes(),
        "",
    ))
}

pub(super) fn failed(e: &QueryError) -> Answer {
    match e {
        QueryError::Bad(BadParam(m)) => text(400, m),
        QueryError::Store(_) => text(503, &e.to_string()),
    }
}

/// The query's pairs, percent-decoded (`+` is a space, as forms send it).
pub(super) fn pairs(target: &str) -> Result<Vec<(String, String)>, BadParam> {
    let Some((_, query)) = target.split_once('?') else {
        return Ok(Vec::new());
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let decode = |s: &str| {
                crate::spec::percent_decode(&s.replace('+', " "))
                    .ok_or_else(|| BadParam(format!("bad percent-encoding in \"{p}\"")))
            };
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// The event store's file, or the 404 that says there is none.
pub(super) fn store(c: &Call<'_>) -> Result<PathBuf, Answer> {
    c.parts
        .events
        .as_ref()
        .map(|s| s.path.clone())
        .ok_or_else(|| {
            text(
                404,
                "no event store: add [events] path = \"events.db\" to the pipeline",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_are_decoded_and_bad_encoding_is_refused() {
        let p = pairs("/api/events?label=a+b&source=front%20door&limit=").unwrap();
        assert_eq!(
            p,
            vec![
                ("label".into(), "a b".into()),
                ("source".into(), "front door".into()),
                ("limit".into(), String::new()),
            ]
        );
        assert!(pairs("/api/events?label=%zz").is_err());
        assert!(pairs("/api/events").unwrap().is_empty());
    }
}
