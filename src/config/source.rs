//! `[sources.NAME]` tables: URI, credentials and live-source behaviour.

use std::time::Duration;

use toml::Spanned;

use super::raw::{RawCalibration, RawReconnect, RawSource};
use crate::frame::{Ground, GroundError};
use crate::source::{
    Credentials, LiveVideo, Reconnect, Secret, SourceConfig, SourceOptions, SourceUri, Transport,
};
use crate::spec::Diagnostic;

pub(super) fn resolve_sources(
    declared: usize,
    raw: Vec<(Spanned<String>, RawSource)>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<SourceConfig> {
    if declared == 0 {
        diags.push(Diagnostic::new(
            "no source: add a [sources.NAME] table with a uri",
        ));
    }
    raw.into_iter()
        .filter_map(|(name, s)| {
            let what = format!("source \"{}\"", name.get_ref());
            let before = diags.len();
            let uri = SourceUri::parse(s.uri.get_ref())
                .map_err(|e| diags.push(Diagnostic::at(s.uri.span(), format!("{what}: {e}"))))
                .ok();
            let options = uri
                .as_ref()
                .map(|uri| options(&what, uri, &s, diags))
                .unwrap_or_default();
            let record = s
                .record_uri
                .as_ref()
                .and_then(|r| record_uri(&what, r, diags));
            match uri {
                Some(uri) if diags.len() == before => Some(SourceConfig {
                    name: name.get_ref().as_str().into(),
                    uri,
                    options,
                    uri_span: s.uri.span(),
                    record,
                }),
                _ => None,
            }
        })
        .collect()
}

/// `record_uri`: an RTSP stream or a file (what can be recorded without decoding).
fn record_uri(what: &str, raw: &Spanned<String>, diags: &mut Vec<Diagnostic>) -> Option<SourceUri> {
    match SourceUri::parse(raw.get_ref()) {
        Ok(uri @ (SourceUri::Rtsp { .. } | SourceUri::File { .. })) => Some(uri),
        Ok(_) => {
            diags.push(Diagnostic::at(
                raw.span(),
                format!("{what}: record_uri must be an rtsp:// stream or a file"),
            ));
            None
        }
        Err(e) => {
            diags.push(Diagnostic::at(
                raw.span(),
                format!("{what}: record_uri: {e}"),
            ));
            None
        }
    }
}

/// Which stream each source records: `record_uri`, else `uri`, for the sources a sink takes
/// packets of (`recorded`); none for the others. A source that cannot be recorded without
/// decoding (a camera device, a test pattern) and has no `record_uri` is a problem.
pub(super) fn settle_records(
    sources: &mut [SourceConfig],
    recorded: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    for source in sources {
        if !recorded.iter().any(|r| **r == *source.name) {
            source.record = None;
            continue;
        }
        if source.record.is_none() {
            match &source.uri {
                uri @ (SourceUri::Rtsp { .. } | SourceUri::File { .. }) => {
                    source.record = Some(uri.clone());
                }
                _ => diags.push(Diagnostic::at(
                    source.uri_span.clone(),
                    format!(
                        "source \"{}\" is recorded as sent, but only an rtsp:// stream or a \
                         file can be: give it a record_uri, or record its decoded frames with \
                         video_file (or clip in mode = \"encode\")",
                        source.name
                    ),
                )),
            }
        }
    }
}

fn options(
    what: &str,
    uri: &SourceUri,
    s: &RawSource,
    diags: &mut Vec<Diagnostic>,
) -> SourceOptions {
    let mut o = SourceOptions::default();
    let mut problem = |span: std::ops::Range<usize>, message: String| {
        diags.push(Diagnostic::at(span, format!("{what}: {message}")));
    };
    let rtsp = matches!(uri, SourceUri::Rtsp { .. });
    let file = matches!(uri, SourceUri::File { .. });

    misplaced_keys(rtsp, file, s, &mut problem);

    if let Some(t) = &s.transport {
        match t.get_ref().as_str() {
            "tcp" => o.transport = Transport::Tcp,
            "udp" => o.transport = Transport::Udp,
            "auto" => o.transport = Transport::Auto,
            other => problem(
                t.span(),
                format!("transport must be \"tcp\", \"udp\" or \"auto\", not \"{other}\""),
            ),
        }
    }
    if let Some(v) = &s.live_video {
        match v.get_ref().as_str() {
            "encode" => o.live_video = LiveVideo::Encode,
            "stills" => o.live_video = LiveVideo::Stills,
            other => problem(
                v.span(),
                format!("live_video must be \"encode\" or \"stills\", not \"{other}\""),
            ),
        }
    }
    if let Some(l) = &s.latency_ms {
        o.latency_ms = *l.get_ref();
    }
    o.queue = if uri.is_live() { 2 } else { 4 };
    if let Some(q) = &s.queue {
        match *q.get_ref() {
            n @ 1..=64 => o.queue = n as usize,
            n => problem(q.span(), format!("queue must be between 1 and 64, not {n}")),
        }
    }
    if let Some(f) = &s.max_fps {
        match *f.get_ref() {
            v @ 1..=1000 => o.max_fps = Some(v),
            v => problem(
                f.span(),
                format!("max_fps must be between 1 and 1000, not {v}"),
            ),
        }
    }
    if let Some(t) = &s.stall_timeout_ms {
        match *t.get_ref() {
            ms @ 100.. => o.stall_timeout = Duration::from_millis(u64::from(ms)),
            ms => problem(
                t.span(),
                format!("stall_timeout_ms must be at least 100, not {ms}"),
            ),
        }
    }
    if let Some(p) = &s.max_frame_pixels {
        match *p.get_ref() {
            n @ 1..=crate::source::FRAME_PIXELS_LIMIT => o.max_frame_pixels = n,
            n => problem(
                p.span(),
                format!(
                    "max_frame_pixels must be between 1 and {} (65535 x 65535), not {n}",
                    crate::source::FRAME_PIXELS_LIMIT
                ),
            ),
        }
    }
    if let Some(l) = &s.looping {
        o.looping = *l.get_ref();
    }
    if let Some(r) = &s.reconnect {
        o.reconnect = reconnect(r, &mut problem);
    }
    if rtsp {
        o.credentials = credentials(uri, s, &mut problem);
    }
    if let Some(c) = &s.calibration {
        o.ground = calibration(c, &mut problem);
    }
    o
}

/// `[sources.NAME.calibration]`, fitted: a problem names the point it is about.
fn calibration(
    c: &Spanned<RawCalibration>,
    problem: &mut impl FnMut(std::ops::Range<usize>, String),
) -> Option<std::sync::Arc<Ground>> {
    let raw = c.get_ref();
    let [width, height] = *raw.size.get_ref();
    if width == 0 || height == 0 {
        problem(
            raw.size.span(),
            format!("calibration.size must be [width, height] in pixels, not [{width}, {height}]"),
        );
        return None;
    }
    let finite = |points: &Spanned<Vec<Spanned<[f64; 2]>>>,
                  what: &str,
                  problem: &mut dyn FnMut(std::ops::Range<usize>, String)| {
        let mut ok = true;
        for p in points.get_ref() {
            if !p.get_ref().iter().all(|v| v.is_finite()) {
                problem(
                    p.span(),
                    format!("calibration.{what}: a point is two finite numbers"),
                );
                ok = false;
            }
        }
        ok
    };
    if !(finite(&raw.image, "image", problem) & finite(&raw.ground, "ground", problem)) {
        return None;
    }
    let image: Vec<[f64; 2]> = raw.image.get_ref().iter().map(|p| *p.get_ref()).collect();
    let ground: Vec<[f64; 2]> = raw.ground.get_ref().iter().map(|p| *p.get_ref()).collect();
    match Ground::fit((width, height), &image, &ground) {
        Ok(g) => Some(std::sync::Arc::new(g)),
        Err(e) => {
            // The point a problem is about, else the list it is in.
            let span = match &e {
                GroundError::OutOfFrame { index, .. } => raw.image.get_ref()[index - 1].span(),
                GroundError::Collinear {
                    what: "ground", c, ..
                } => raw.ground.get_ref()[c - 1].span(),
                GroundError::Collinear { c, .. } => raw.image.get_ref()[c - 1].span(),
                GroundError::AllInLine { what: "ground" } | GroundError::Unpaired { .. } => {
                    raw.ground.span()
                }
                GroundError::TooFew(_) | GroundError::AllInLine { .. } => raw.image.span(),
                GroundError::Inconsistent { index, .. } => raw.ground.get_ref()[index - 1].span(),
                GroundError::Folded => c.span(),
            };
            problem(span, format!("calibration: {e}"));
            None
        }
    }
}

/// Keys that only make sense for some kinds of source, given to another.
fn misplaced_keys(
    rtsp: bool,
    file: bool,
    s: &RawSource,
    problem: &mut impl FnMut(std::ops::Range<usize>, String),
) {
    let rtsp_only = [
        ("user", s.user.as_ref().map(Spanned::span)),
        ("password", s.password.as_ref().map(Spanned::span)),
        ("password_file", s.password_file.as_ref().map(Spanned::span)),
        ("transport", s.transport.as_ref().map(Spanned::span)),
        ("latency_ms", s.latency_ms.as_ref().map(Spanned::span)),
    ];
    let misplaced = rtsp_only
        .into_iter()
        .filter(|_| !rtsp)
        .map(|(key, at)| (key, at, "rtsp sources"))
        .chain((!file).then_some((
            "loop",
            s.looping.as_ref().map(Spanned::span),
            "file sources",
        )));
    for (key, at, kind) in misplaced {
        if let Some(at) = at {
            problem(at, format!("\"{key}\" applies to {kind} only"));
        }
    }
}

/// The `[sources.NAME.reconnect]` table, defaults for what it leaves out.
fn reconnect(
    r: &RawReconnect,
    problem: &mut impl FnMut(std::ops::Range<usize>, String),
) -> Reconnect {
    let ms = |v: &Option<Spanned<u64>>| v.as_ref().map(|v| Duration::from_millis(*v.get_ref()));
    let defaults = Reconnect::default();
    let reconnect = Reconnect {
        initial_delay: ms(&r.initial_delay_ms).unwrap_or(defaults.initial_delay),
        max_delay: ms(&r.max_delay_ms).unwrap_or(defaults.max_delay),
        max_attempts: r.max_attempts.as_ref().map(|v| *v.get_ref()),
        reset_after: ms(&r.reset_after_ms).unwrap_or(defaults.reset_after),
    };
    if let Some(d) = &r.initial_delay_ms
        && *d.get_ref() < 10
    {
        problem(
            d.span(),
            "reconnect.initial_delay_ms must be at least 10".to_owned(),
        );
    }
    if reconnect.max_delay < reconnect.initial_delay {
        let span = r.max_delay_ms.as_ref().map_or(0..0, Spanned::span);
        problem(
            span,
            "reconnect.max_delay_ms must not be below initial_delay_ms".to_owned(),
        );
    }
    reconnect
}

/// `user` with `password` (a value or `${VARIABLE}`) or `password_file`.
fn credentials(
    uri: &SourceUri,
    s: &RawSource,
    problem: &mut impl FnMut(std::ops::Range<usize>, String),
) -> Option<Credentials> {
    let password = match (&s.password, &s.password_file) {
        (Some(_), Some(f)) => {
            problem(
                f.span(),
                "give \"password\" or \"password_file\", not both".to_owned(),
            );
            return None;
        }
        (Some(p), None) => match expand(p.get_ref()) {
            Ok(v) => v,
            Err(message) => {
                problem(p.span(), message);
                return None;
            }
        },
        (None, Some(f)) => match crate::spec::read_password_file(f.get_ref()) {
            Ok(v) => v,
            Err(message) => {
                problem(f.span(), message);
                return None;
            }
        },
        (None, None) => {
            if let Some(u) = &s.user {
                problem(
                    u.span(),
                    "\"user\" needs \"password\" or \"password_file\"".to_owned(),
                );
            }
            return None;
        }
    };
    let Some(user) = &s.user else {
        let span = s
            .password
            .as_ref()
            .map(Spanned::span)
            .or(s.password_file.as_ref().map(Spanned::span))
            .unwrap_or(0..0);
        problem(span, "a password needs \"user\"".to_owned());
        return None;
    };
    if uri.has_credentials() {
        problem(
            user.span(),
            "the uri already has credentials; give them in one place".to_owned(),
        );
        return None;
    }
    Some(Credentials {
        user: user.get_ref().clone(),
        password: Secret::new(password),
    })
}

/// `${VARIABLE}` -> its value; anything else is taken as it is.
fn expand(value: &str) -> Result<String, String> {
    match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
        Some(var) => std::env::var(var)
            .map_err(|_| format!("environment variable \"{var}\" (for the password) is not set")),
        None => Ok(value.to_owned()),
    }
}
