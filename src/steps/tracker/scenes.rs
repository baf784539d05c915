//! The tracker on scripted scenes of people walking in a 320 x 240 frame at 25 frames/s, with
//! the default settings (appearance on: each person has colours of their own): two people
//! swapping places behind each other, one stopping for 2 s, one leaving and coming back.

use super::Settings;
use super::appearance::Colours;
use super::tracks::Tracks;
use crate::value::{BBox, Detection, Track};

const FRAME: [f32; 2] = [320.0, 240.0];

/// A person: the top left of their 20 x 60 box, their colour class and the confidence.
#[derive(Clone, Copy)]
struct Person {
    x: f32,
    y: f32,
    colour: usize,
    confidence: f32,
}

impl Person {
    fn bbox(&self) -> BBox {
        BBox {
            x: self.x,
            y: self.y,
            width: 20.0,
            height: 60.0,
        }
    }
}

fn person(x: f32, y: f32, colour: usize) -> Person {
    Person {
        x,
        y,
        colour,
        confidence: 0.9,
    }
}

/// Runs the frames (each the people the detector sees); gives each frame's tracks.
fn run(settings: &Settings, frames: &[Vec<Person>]) -> Vec<Vec<Track>> {
    let mut tracks = Tracks::default();
    frames
        .iter()
        .zip(0u64..)
        .map(|(people, seq)| {
            let detections: Vec<Detection> = people
                .iter()
                .map(|p| Detection::new("person".into(), p.confidence, p.bbox()))
                .collect();
            let looks: Vec<Option<Colours>> = people
                .iter()
                .map(|p| Some(Colours::solid(p.colour)))
                .collect();
            tracks.update(settings, seq, Some(&detections), Some(FRAME), Some(&looks))
        })
        .collect()
}

/// The ID of the track (seen, not predicted) whose box overlaps `p`'s most, at IoU 0.5 or
/// more: a reported box is the filter's estimate, near the detection and not on it.
fn id_at(tracks: &[Track], p: &Person) -> Option<u64> {
    let bbox = p.bbox();
    tracks
        .iter()
        .filter(|t| !t.predicted)
        .map(|t| (t.detection.bbox.iou(&bbox), t.track_id))
        .filter(|&(iou, _)| iou >= 0.5)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, id)| id)
}

/// Every box reported lies inside the frame.
fn all_inside(frames: &[Vec<Track>]) -> bool {
    frames.iter().flatten().all(|t| {
        let b = t.detection.bbox;
        b.x >= 0.0 && b.y >= 0.0 && b.x + b.width <= FRAME[0] && b.y + b.height <= FRAME[1]
    })
}

#[test]
fn two_people_swapping_places_behind_each_other_keep_their_ids() {
    // A (colour 8) walks right, B (colour 45) left, 3 px a frame, B a little further back
    // (higher up). While their boxes overlap, B is hidden behind A: only A is detected. They
    // meet, stop side by side (A now where B came from) for 20 frames and go back the way
    // they came: a constant-velocity guess alone would carry each on through the other.
    let mut frames = Vec::new();
    let mut xs = (40.0f32, 260.0f32);
    let mut walk = |dx: f32, n: usize, frames: &mut Vec<Vec<Person>>| {
        for _ in 0..n {
            xs = (xs.0 + dx, xs.1 - dx);
            let (a, b) = (person(xs.0, 100.0, 8), person(xs.1, 90.0, 45));
            let hidden = (a.x - b.x).abs() < 20.0;
            frames.push(if hidden { vec![a] } else { vec![a, b] });
        }
    };
    walk(3.0, 44, &mut frames); // A at 172, B at 128: past each other.
    walk(0.0, 20, &mut frames);
    walk(-3.0, 44, &mut frames); // back where they started.
    let out = run(&Settings::default(), &frames);
    let mut ids = (None, None);
    for (f, (people, tracks)) in frames.iter().zip(&out).enumerate().skip(2) {
        let a = id_at(tracks, &people[0]);
        assert!(a.is_some(), "frame {f}: A untracked: {tracks:?}");
        assert_eq!(*ids.0.get_or_insert(a), a, "frame {f}: A's ID changed");
        if let Some(b) = people.get(1) {
            let b = id_at(tracks, b);
            assert!(b.is_some(), "frame {f}: B untracked: {tracks:?}");
            assert_eq!(*ids.1.get_or_insert(b), b, "frame {f}: B's ID changed");
        }
    }
    assert_ne!(ids.0, ids.1);
    assert!(all_inside(&out));
}

#[test]
fn one_who_stops_for_two_seconds_keeps_their_id() {
    // Walks right 4 px a frame, stands still for 50 frames (2 s), missed by the detector on
    // one frame in three while standing (seen at low confidence on another), walks on; a
    // second person walks past behind meanwhile.
    let mut frames = Vec::new();
    let mut x = 20.0;
    for f in 0..120 {
        let standing = (30..80).contains(&f);
        if !standing {
            x += 4.0;
        }
        let mut me = person(x, 120.0, 20);
        if standing && f % 3 == 1 {
            me.confidence = 0.3;
        }
        let other = person(300.0 - 2.5 * f as f32, 60.0, 60);
        frames.push(if standing && f % 3 == 0 {
            vec![other]
        } else {
            vec![me, other]
        });
    }
    let out = run(&Settings::default(), &frames);
    let mine: Vec<u64> = frames
        .iter()
        .zip(&out)
        .skip(2)
        .filter(|(people, _)| people.len() == 2)
        .map(|(people, tracks)| id_at(tracks, &people[0]).expect("seen, so tracked"))
        .collect();
    assert!(mine.iter().all(|&id| id == mine[0]), "{mine:?}");
    assert!(all_inside(&out));
}

#[test]
fn one_who_leaves_is_dropped_at_the_edge_and_comes_back_under_a_new_id() {
    // Walks right 6 px a frame out of the frame (gone from frame 50), is away 40 frames,
    // and walks back in from the right. Lost tracks are reported here (report_lost 30), so
    // a guess carried on past the edge would show.
    let settings = Settings {
        report_lost: 30,
        ..Settings::default()
    };
    let mut frames: Vec<Vec<Person>> = Vec::new();
    for f in 0..130u16 {
        let x = f32::from(f) * 6.0;
        frames.push(match f {
            0..50 if x + 20.0 <= FRAME[0] => vec![person(x, 100.0, 30)],
            90.. => vec![person(320.0 - f32::from(f - 89) * 5.0, 100.0, 30)],
            _ => vec![],
        });
    }
    let out = run(&settings, &frames);
    assert!(all_inside(&out), "a box outside the frame");
    // Reported as predicted for at most a few frames once out of sight, then dropped.
    let last_seen = frames[..90].iter().rposition(|p| !p.is_empty()).unwrap();
    let ghosts = out[last_seen + 1..90]
        .iter()
        .filter(|t| !t.is_empty())
        .count();
    assert!(
        ghosts <= 3,
        "predicted on for {ghosts} frames after leaving"
    );
    let first = id_at(&out[10], &frames[10][0]).unwrap();
    let back = id_at(&out[100], &frames[100][0]).unwrap();
    assert_ne!(first, back, "a track that left the frame was kept");
    for f in 92..130 {
        assert_eq!(id_at(&out[f], &frames[f][0]), Some(back), "frame {f}");
    }
}
