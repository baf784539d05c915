//! `zone_count`'s parameters: each zone as a points list or a table of its points and limits
//! (`loiter_s`, `max_speed_kmh`, `max_speed_px_s`), the step's defaults for those limits, and
//! their checks, with the place in the file of what is wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::{Limits, Zone, Zones};
use crate::spec::{Diagnostic, ParamDoc};
use crate::steps::common::geometry::{Anchor, Polygon, RawPoints};
use crate::steps::common::reid::Reid;

pub(super) const ZONES_DOC: ParamDoc = ParamDoc {
    name: "zones",
    ty: "table of name = [[x, y], ...] or name = { points = [[x, y], ...], loiter_s = float > 0, max_speed_kmh = float > 0, max_speed_px_s = float > 0 }",
    default: "required",
    doc: "one or more polygons (at least 3 points each), in pixels of the tracked image; the table form gives a zone its own loiter_s and speed limits (each in place of the step's)",
};

pub(super) const LOITER_S_DOC: ParamDoc = ParamDoc {
    name: "loiter_s",
    ty: "float > 0",
    default: "none",
    doc: "a \"loiter\" event, once per visit, when a track has been inside a zone longer than this (seconds of frame time); for every zone without its own",
};

pub(super) const MAX_SPEED_KMH_DOC: ParamDoc = ParamDoc {
    name: "max_speed_kmh",
    ty: "float > 0",
    default: "none",
    doc: "a \"speeding\" event, once per visit, when a track seen inside a zone goes faster (km/h: only on a source with a [sources.NAME.calibration]); for every zone without its own limits",
};

pub(super) const MAX_SPEED_PX_S_DOC: ParamDoc = ParamDoc {
    name: "max_speed_px_s",
    ty: "float > 0",
    default: "none",
    doc: "the same in pixels a second, for a source without a calibration; for every zone without its own limits",
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Config {
    zones: Spanned<BTreeMap<String, Spanned<RawZone>>>,
    classes: Option<Vec<String>>,
    anchor: Option<Anchor>,
    reid_distance: Option<Spanned<f32>>,
    reid_frames: Option<Spanned<i64>>,
    loiter_s: Option<Spanned<f64>>,
    max_speed_kmh: Option<Spanned<f64>>,
    max_speed_px_s: Option<Spanned<f64>>,
}

/// A zone as written: `[[x, y], ...]`, or `{ points = [[x, y], ...], loiter_s = 30.0, ... }`.
#[derive(Debug)]
enum RawZone {
    Points(Vec<Spanned<Vec<Spanned<f64>>>>),
    Table(ZoneTable),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneTable {
    points: RawPoints,
    loiter_s: Option<Spanned<f64>>,
    max_speed_kmh: Option<Spanned<f64>>,
    max_speed_px_s: Option<Spanned<f64>>,
}

/// By hand, not `#[serde(untagged)]`: that buffers the value and loses every span inside it.
impl<'de> Deserialize<'de> for RawZone {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = RawZone;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("points [[x, y], ...] or a table { points = [[x, y], ...], ... }")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawZone, A::Error> {
                Deserialize::deserialize(SeqAccessDeserializer::new(seq)).map(RawZone::Points)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawZone, A::Error> {
                ZoneTable::deserialize(MapAccessDeserializer::new(map)).map(RawZone::Table)
            }
        }
        d.deserialize_any(Either)
    }
}

/// `value` checked to be a finite number > 0; `what` prefixes the message (`zone "door": `).
fn positive(value: Option<Spanned<f64>>, key: &str, what: &str) -> Result<Option<f64>, Diagnostic> {
    match value {
        None => Ok(None),
        Some(v) if v.get_ref().is_finite() && *v.get_ref() > 0.0 => Ok(Some(*v.get_ref())),
        Some(v) => Err(Diagnostic::at(
            v.span(),
            format!("{what}{key} must be a number > 0, not {}", v.get_ref()),
        )),
    }
}

/// The limits a zone is held to: its own where it gives any, else the step's.
fn limits(
    loiter_s: Option<Spanned<f64>>,
    kmh: Option<Spanned<f64>>,
    px_s: Option<Spanned<f64>>,
    what: &str,
) -> Result<Limits, Diagnostic> {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a speed limit, compared with f32 speeds"
    )]
    let speed = |v: Option<f64>| v.map(|v| v as f32);
    Ok(Limits {
        loiter_s: positive(loiter_s, "loiter_s", what)?,
        max_kmh: speed(positive(kmh, "max_speed_kmh", what)?),
        max_px_s: speed(positive(px_s, "max_speed_px_s", what)?),
    })
}

impl Config {
    /// The checked zones, in name order.
    pub(super) fn resolve(self) -> Result<Zones, Diagnostic> {
        if self.zones.get_ref().is_empty() {
            return Err(Diagnostic::at(
                self.zones.span(),
                "zones needs at least one zone: name = [[x, y], ...]",
            ));
        }
        let step = limits(self.loiter_s, self.max_speed_kmh, self.max_speed_px_s, "")?;
        let mut zones = Vec::new();
        for (name, raw) in self.zones.into_inner() {
            let what = format!("zone \"{name}\"");
            let span = raw.span();
            let (points, limits) = match raw.into_inner() {
                RawZone::Points(points) => (Spanned::new(span, points), step),
                RawZone::Table(t) => {
                    let own = limits(
                        t.loiter_s,
                        t.max_speed_kmh,
                        t.max_speed_px_s,
                        &format!("{what}: "),
                    )?;
                    let speed_given = own.max_kmh.is_some() || own.max_px_s.is_some();
                    let limits = Limits {
                        loiter_s: own.loiter_s.or(step.loiter_s),
                        max_kmh: if speed_given {
                            own.max_kmh
                        } else {
                            step.max_kmh
                        },
                        max_px_s: if speed_given {
                            own.max_px_s
                        } else {
                            step.max_px_s
                        },
                    };
                    (t.points, limits)
                }
            };
            zones.push(Zone {
                polygon: Polygon::parse(&points, &what)?,
                name: Arc::from(name.as_str()),
                limits,
            });
        }
        Ok(Zones {
            zones,
            classes: self
                .classes
                .map(|cs| cs.into_iter().map(Arc::from).collect()),
            anchor: self.anchor.unwrap_or_default(),
            reid: Reid::parse(self.reid_distance, self.reid_frames)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Params;

    /// The zones of a step table `text`, or the message and the text its span covers.
    fn parse(text: &str) -> Result<Zones, (String, String)> {
        Params::from_toml(text)
            .parse::<Config>()
            .and_then(Config::resolve)
            .map_err(|d| {
                let at = d
                    .span
                    .clone()
                    .map(|s| text[s].to_owned())
                    .unwrap_or_default();
                (d.message, at)
            })
    }

    #[test]
    fn a_zone_is_points_or_a_table_with_its_own_limits_over_the_steps() {
        let zones = parse(
            "loiter_s = 30\nmax_speed_kmh = 20.0\nzones = { a = [[0, 0], [10, 0], [0, 10]], \
             b = { points = [[0, 0], [10, 0], [0, 10]], loiter_s = 5.5, max_speed_px_s = 300 }, \
             c = { points = [[0, 0], [10, 0], [0, 10]] } }",
        )
        .unwrap();
        let limits: Vec<_> = zones.zones.iter().map(|z| (&*z.name, z.limits)).collect();
        let step = Limits {
            loiter_s: Some(30.0),
            max_kmh: Some(20.0),
            max_px_s: None,
        };
        let b = Limits {
            loiter_s: Some(5.5),
            max_kmh: None,
            max_px_s: Some(300.0),
        };
        assert_eq!(limits, vec![("a", step), ("b", b), ("c", step)]);
        assert_eq!(zones.zones[1].polygon.points()[1], [10.0, 0.0]);
    }

    #[test]
    fn a_bad_limit_or_key_is_refused_where_it_is_written() {
        let tri = "[[0, 0], [10, 0], [0, 10]]";
        let cases = [
            (
                format!("loiter_s = -1\nzones = {{ a = {tri} }}"),
                "loiter_s must be a number > 0, not -1",
                "-1",
            ),
            (
                format!("zones = {{ door = {{ points = {tri}, max_speed_kmh = 0 }} }}"),
                "zone \"door\": max_speed_kmh must be a number > 0, not 0",
                "0",
            ),
            (
                format!("zones = {{ door = {{ points = {tri}, loiter = 3 }} }}"),
                "unknown key \"loiter\"",
                "loiter",
            ),
            (
                "zones = { door = { points = [[0, 0], [10, 0]] } }".to_owned(),
                "zone \"door\" needs at least 3 points [x, y], not 2",
                "[[0, 0], [10, 0]]",
            ),
            (
                "zones = { door = [[0, 0], [10, 0]] }".to_owned(),
                "zone \"door\" needs at least 3 points [x, y], not 2",
                "[[0, 0], [10, 0]]",
            ),
        ];
        for (text, message, at) in cases {
            let (said, span) = parse(&text).map(|_| ()).unwrap_err();
            assert!(said.contains(message), "{text}: {said}");
            assert_eq!(span, at, "{text}: {said}");
        }
    }
}
