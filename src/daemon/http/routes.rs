//! The JSON API's routes, in one table ([`ROUTES`]): its method, its path (`{name}` stands for
//! one segment), the query parameters it takes and what answers it. The loop reads it to hand
//! a request on (`mod.rs`: the live stream to the live thread, the rest to the API threads),
//! the API threads to answer (`api.rs`), and `tests/api_spec.rs`, through [`routes`], to hold
//! docs/reference/api.json to it both ways.
//!
//! A query parameter a route does not name is a 400, on every route (no route takes extras):
//! a typo never silently returns everything. The one exception is [`IGNORED`] (`_`), which
//! every route takes and ignores: the cache-buster (`?_=1733212800000`) that jQuery and many
//! dashboards add to each request.

use super::answer::{Answer, Call};
use super::handlers as api;
use super::{heatmap, recordings};

/// What answers a route.
#[derive(Clone, Copy)]
pub(super) enum Handler {
    /// The live thread (`live.rs`): a stream of Server-Sent Events.
    Live,
    /// The video thread (`video/`): a source's H.264 as fragmented MP4.
    Video,
    /// An API thread.
    Api(fn(&Call<'_>) -> Answer),
}

/// One route.
pub(super) struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub query: &'static [&'static str],
    pub handler: Handler,
}

/// The query parameter every route takes and ignores (a cache-buster).
pub(super) const IGNORED: &str = "_";

/// Every route of the API. A new one is one line here, its handler in `api.rs`, and its entry in
/// docs/reference/api.json.
pub(super) const ROUTES: &[Route] = &[
    Route::get("/api/sources", &[], Handler::Api(api::sources)),
    Route::get("/api/health", &[], Handler::Api(api::health)),
    Route::get(
        "/api/events",
        &[
            "source",
            "kind",
            "label",
            "place",
            "zone",
            "line",
            "after",
            "before",
            "before_id",
            "limit",
        ],
        Handler::Api(api::events),
    ),
    Route::get("/api/events/{id}", &[], Handler::Api(api::event)),
    Route::get(
        "/api/events/{id}/snapshot.jpg",
        &[],
        Handler::Api(api::snapshot),
    ),
    Route::get("/api/events/{id}/clip.mp4", &[], Handler::Api(api::clip)),
    Route::get(
        "/api/recordings",
        &["source", "after", "before", "limit", "cursor"],
        Handler::Api(recordings::recordings),
    ),
    Route::get(
        "/api/media/{sink}/{id}/{file}",
        &[],
        Handler::Api(api::media),
    ),
    Route::get(
        "/api/counts",
        &[
            "source", "step", "bucket", "after", "before", "limit", "cursor",
        ],
        Handler::Api(api::counts),
    ),
    Route::get(
        "/api/counts/zones",
        &["source", "step", "place", "bucket", "after", "before"],
        Handler::Api(heatmap::zones),
    ),
    Route::get(
        "/api/heatmap",
        &["source", "label", "after", "before", "format"],
        Handler::Api(heatmap::heatmap),
    ),
    Route::get(
        "/api/live",
        &["stills", "stills_of", "frames"],
        Handler::Live,
    ),
    Route::get(
        "/api/live/{source}",
        &["stills", "stills_of", "frames"],
        Handler::Live,
    ),
    Route::get("/api/video/{source}", &[], Handler::Video),
];

impl Route {
    const fn get(path: &'static str, query: &'static [&'static str], handler: Handler) -> Self {
        Self {
            method: "GET",
            path,
            query,
            handler,
        }
    }

    /// The path's `{name}` segments in `path`, if it is this route's.
    fn matches<'p>(&self, path: &'p str) -> Option<Vec<&'p str>> {
        let mut args = Vec::new();
        let mut given = path.split('/');
        for want in self.path.split('/') {
            let got = given.next()?;
            if want.starts_with('{') {
                (!got.is_empty()).then_some(())?;
                args.push(got);
            } else if want != got {
                return None;
            }
        }
        given.next().is_none().then_some(args)
    }

    /// The first query key this route does not take, as the 400's message.
    pub(super) fn unknown(&self, pairs: &[(String, String)]) -> Option<String> {
        let (key, _) = pairs
            .iter()
            .find(|(k, _)| k != IGNORED && !self.query.contains(&k.as_str()))?;
        Some(if self.query.is_empty() {
            format!("unknown parameter \"{key}\": {} takes none", self.path)
        } else {
            format!(
                "unknown parameter \"{key}\": expected {}",
                self.query.join(", ")
            )
        })
    }
}

/// The route of `method` and `path`, with the path's `{name}` segments (as sent).
pub(super) fn find<'p>(method: &str, path: &'p str) -> Option<(&'static Route, Vec<&'p str>)> {
    ROUTES
        .iter()
        .filter(|r| r.method == method)
        .find_map(|r| Some((r, r.matches(path)?)))
}

/// A route as the API's documentation describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDoc {
    pub method: &'static str,
    /// With `{name}` for each segment it takes.
    pub path: &'static str,
    /// The query parameters it takes, [`IGNORED`] last; any other is a 400.
    pub query: Vec<&'static str>,
}

/// The API's routes, as [`ROUTES`] has them (for `tests/api_spec.rs`).
pub fn routes() -> Vec<RouteDoc> {
    ROUTES
        .iter()
        .map(|r| RouteDoc {
            method: r.method,
            path: r.path,
            query: r.query.iter().copied().chain([IGNORED]).collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_finds_its_route_and_its_segments() {
        let (r, args) = find("GET", "/api/events/12/clip.mp4").unwrap();
        assert_eq!((r.path, args), ("/api/events/{id}/clip.mp4", vec!["12"]));
        let (r, args) = find("GET", "/api/media/rec/0123abcd/a%20b.mp4").unwrap();
        assert_eq!(
            (r.path, args),
            (
                "/api/media/{sink}/{id}/{file}",
                vec!["rec", "0123abcd", "a%20b.mp4"]
            )
        );
        assert_eq!(find("GET", "/api/events").unwrap().0.path, "/api/events");
        for missing in [
            "/api/events/",
            "/api/events/1/x",
            "/api/nope",
            "/api/media/rec",
            "/api/media/rec/a.mp4",
        ] {
            assert!(find("GET", missing).is_none(), "{missing}");
        }
        assert!(find("POST", "/api/events").is_none());
        let q = |k: &str| vec![(k.to_owned(), String::new())];
        let counts = find("GET", "/api/counts").unwrap().0;
        assert_eq!(counts.unknown(&q("bucket")), None);
        assert_eq!(counts.unknown(&q("_")), None);
        let e = counts.unknown(&q("buckets")).unwrap();
        assert!(
            e.starts_with("unknown parameter \"buckets\": expected source, step"),
            "{e}"
        );
        let e = find("GET", "/api/sources")
            .unwrap()
            .0
            .unknown(&q("x"))
            .unwrap();
        assert_eq!(e, "unknown parameter \"x\": /api/sources takes none");
    }
}
