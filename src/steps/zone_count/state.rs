//! One source's zone state: which zones each track, live or lately lost, is in, since when
//! and under which ID each visit began, and what each visit has said (see the module header
//! of `zone_count`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{Limits, Zones};
use crate::steps::common::geometry::Point;
use crate::value::{BBox, Counts, Event, EventKind, Speed, Track};

/// What one source's tracks, live or lately lost, were last seen doing.
#[derive(Debug, Default)]
pub(super) struct ZoneState {
    /// Frames taken so far.
    frame: u64,
    tracks: HashMap<u64, Inside>,
    /// Whether this source was told that a speed limit of a zone is in a unit its tracks'
    /// speeds never come in (said once).
    told_never_fires: bool,
    /// The picture's size (width, height), where the boxes are: a track lost at its edge has
    /// walked out of it (see [`ZoneState::counts`]).
    pub(super) picture: Option<(i32, i32)>,
}

/// How close (a share of the picture's width or height, at least [`EDGE_MIN_PX`]) a box's
/// edge must come to the picture's for a track lost there to have left the picture.
const EDGE_SHARE: f32 = 0.01;
const EDGE_MIN_PX: f32 = 2.0;

/// One track: its visit of each zone it is in (by zone index), how and where it was last seen,
/// and when it was last in the input.
#[derive(Debug)]
struct Inside {
    visits: Vec<Option<Visit>>,
    class: Arc<str>,
    bbox: BBox,
    at: Point,
    /// The frame (of this state's count) it was last in the input.
    present: u64,
}

/// One stay in one zone, from its enter.
#[derive(Debug, Clone, Copy)]
struct Visit {
    /// The track ID it entered under: every event of the visit carries it.
    id: u64,
    /// Frame time of the enter, seconds.
    since: f64,
    /// Frame time it was last seen inside.
    seen: f64,
    loitered: bool,
    sped: bool,
}

impl Visit {
    /// Seconds from the enter to `t`.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "seconds, as events carry them"
    )]
    fn dwell(&self, t: f64) -> f32 {
        (t - self.since).max(0.0) as f32
    }
}

/// What one frame gives.
#[derive(Debug)]
pub(super) struct Update {
    pub counts: Counts,
    pub events: Vec<Event>,
    /// The input tracks, each with its time inside the zones it is in now.
    pub tracks: Vec<Track>,
    /// A limit that can never fire on this source, said the first time it is seen.
    pub never_fires: Option<String>,
}

/// Whether `speed` breaks `limits` (`Ok(false)` if not), or `Err` with why a limit cannot be
/// judged: it is in the other unit and the zone has none in this one.
fn too_fast(speed: Speed, limits: &Limits) -> Result<bool, &'static str> {
    match (speed, limits.max_kmh, limits.max_px_s) {
        (Speed::Kmh(v), Some(max), _) | (Speed::PxPerS(v), _, Some(max)) => Ok(v > max),
        (Speed::PxPerS(_), Some(_), None) => Err(
            "a speed limit in km/h (max_speed_kmh), but this source's speeds are in px/s: it has no [sources.NAME.calibration], so the limit never fires",
        ),
        (Speed::Kmh(_), None, Some(_)) => Err(
            "a speed limit in px/s (max_speed_px_s), but this source's speeds are in km/h (it is calibrated), so the limit never fires",
        ),
        _ => Ok(false),
    }
}

impl ZoneState {
    /// Takes one frame's tracks at frame time `t` (seconds); gives the counts now, the tracks
    /// with their time inside, and this frame's events: for each track in input order, zones
    /// in name order, its enter or leave, loiter and speeding; then the leaves of the tracks
    /// that ended (absent for more than `reid_frames`), by track ID.
    pub(super) fn update(&mut self, zones: &Zones, tracks: &[Track], t: f64) -> Update {
        self.frame += 1;
        let now = self.frame;
        let mut events = Vec::new();
        let mut never_fires = None;
        let counted = tracks.iter().filter(|t| {
            zones
                .classes
                .as_ref()
                .is_none_or(|cs| cs.contains(&t.detection.class))
        });
        let counted: Vec<&Track> = counted.collect();
        for tr in &counted {
            if let Some(known) = self.tracks.get_mut(&tr.track_id) {
                known.present = now;
            }
        }
        for tr in counted {
            let d = &tr.detection;
            let at = zones.anchor.of(&d.bbox);
            if !tr.predicted && !self.tracks.contains_key(&tr.track_id) {
                let state = self
                    .take_lost_near(zones, at, &d.class)
                    .unwrap_or_else(|| Inside {
                        visits: vec![None; zones.zones.len()],
                        class: d.class.clone(),
                        bbox: d.bbox,
                        at,
                        present: now,
                    });
                self.tracks.insert(tr.track_id, state);
            }
            let Some(state) = self.tracks.get_mut(&tr.track_id) else {
                continue;
            };
            if !tr.predicted {
                state.bbox = d.bbox;
                state.at = at;
            }
            for (z, zone) in zones.zones.iter().enumerate() {
                let event = |kind, id| Event {
                    speed: tr.speed,
                    ..Event::new(kind, id, d.class.clone(), zone.name.clone(), d.bbox)
                };
                let visit = &mut state.visits[z];
                if !tr.predicted {
                    match (visit.as_mut(), zone.polygon.contains(at)) {
                        (None, true) => {
                            *visit = Some(Visit {
                                id: tr.track_id,
                                since: t,
                                seen: t,
                                loitered: false,
                                sped: false,
                            });
                            events.push(event(EventKind::Enter, tr.track_id));
                        }
                        (Some(v), false) => {
                            let dwell = v.dwell(v.seen);
                            events.push(Event {
                                dwell_s: Some(dwell),
                                ..event(EventKind::Leave, v.id)
                            });
                            *visit = None;
                        }
                        (Some(v), true) => v.seen = t,
                        (None, false) => {}
                    }
                }
                let Some(v) = visit else { continue };
                let dwell = Some(v.dwell(t));
                if !v.loitered && zone.limits.loiter_s.is_some_and(|l| t - v.since > l) {
                    v.loitered = true;
                    events.push(Event {
                        dwell_s: dwell,
                        ..event(EventKind::Loiter, v.id)
                    });
                }
                let Some(speed) = tr.speed.filter(|_| !tr.predicted && !v.sped) else {
                    continue;
                };
                match too_fast(speed, &zone.limits) {
                    Ok(true) => {
                        v.sped = true;
                        events.push(Event {
                            dwell_s: dwell,
                            ..event(EventKind::Speeding, v.id)
                        });
                    }
                    Ok(false) => {}
                    Err(why) if !self.told_never_fires => {
                        self.told_never_fires = true;
                        never_fires = Some(format!("zone \"{}\" has {why}", zone.name));
                    }
                    Err(_) => {}
                }
            }
        }
        self.end_lost(zones, &mut events);
        Update {
            counts: self.counts(zones),
            tracks: self.with_dwell(zones, tracks, t),
            events,
            never_fires,
        }
    }

    /// The leaves of the tracks absent for more than `reid_frames`, by track ID; forgets them.
    fn end_lost(&mut self, zones: &Zones, events: &mut Vec<Event>) {
        let now = self.frame;
        let mut ended: Vec<u64> = self
            .tracks
            .iter()
            .filter(|(_, s)| now - s.present > zones.reid.frames)
            .map(|(id, _)| *id)
            .collect();
        ended.sort_unstable();
        for id in ended {
            let Some(gone) = self.tracks.remove(&id) else {
                continue;
            };
            for (zone, visit) in zones.zones.iter().zip(&gone.visits) {
                let Some(v) = visit else { continue };
                let leave = Event::new(
                    EventKind::Leave,
                    v.id,
                    gone.class.clone(),
                    zone.name.clone(),
                    gone.bbox,
                );
                events.push(Event {
                    dwell_s: Some(v.dwell(v.seen)),
                    ..leave
                });
            }
        }
    }

    /// Objects inside each zone now: the tracks of this frame inside it, and those lately lost
    /// inside it (held for `reid_frames`: a detector that misses someone for a moment does not
    /// take them out of a queue), but for a track lost at the picture's edge, which has walked
    /// out of the picture (held all the same, so that it is one visit if it comes back; its
    /// visit ends when it was last seen). Without that, each person leaving the picture from a
    /// zone that reaches its edge stayed counted `reid_frames` more: +10% object-seconds on
    /// PETS09-S2L1's walkway (scripts/bench-analytics).
    fn counts(&self, zones: &Zones) -> Counts {
        let counts = zones.zones.iter().enumerate().map(|(z, zone)| {
            let n = self.tracks.values().filter(|s| {
                s.visits[z].is_some() && (s.present == self.frame || !self.at_edge(&s.bbox))
            });
            (zone.name.clone(), n.count() as u64)
        });
        Counts(counts.collect())
    }

    /// Whether `b` touches the picture's edge (see [`EDGE_SHARE`]).
    fn at_edge(&self, b: &BBox) -> bool {
        let Some((w, h)) = self.picture else {
            return false;
        };
        let (w, h) = (w as f32, h as f32);
        let (mx, my) = (
            (w * EDGE_SHARE).max(EDGE_MIN_PX),
            (h * EDGE_SHARE).max(EDGE_MIN_PX),
        );
        b.x <= mx || b.y <= my || b.x + b.width >= w - mx || b.y + b.height >= h - my
    }

    /// `tracks`, each with its seconds (at `t`) inside the zones it is in now.
    fn with_dwell(&self, zones: &Zones, tracks: &[Track], t: f64) -> Vec<Track> {
        tracks
            .iter()
            .map(|tr| {
                let dwell: BTreeMap<Arc<str>, f32> = self
                    .tracks
                    .get(&tr.track_id)
                    .into_iter()
                    .flat_map(|s| zones.zones.iter().zip(&s.visits))
                    .filter_map(|(zone, v)| v.map(|v| (zone.name.clone(), v.dwell(t))))
                    .collect();
                Track {
                    dwell: (!dwell.is_empty()).then(|| Arc::new(dwell)),
                    ..tr.clone()
                }
            })
            .collect()
    }

    /// Removes and gives the lost track (absent from this frame's input) of `class` last seen
    /// nearest to `at`, within `reid_distance`.
    fn take_lost_near(&mut self, zones: &Zones, at: Point, class: &str) -> Option<Inside> {
        let gap = |s: &Inside| (s.at[0] - at[0]).hypot(s.at[1] - at[1]);
        let (&id, _) = self
            .tracks
            .iter()
            .filter(|(_, s)| {
                s.present < self.frame && *s.class == *class && gap(s) <= zones.reid.distance
            })
            .min_by(|a, b| gap(a.1).total_cmp(&gap(b.1)))?;
        self.tracks.remove(&id)
    }
}
