//! How long `speed_window_s` should be, measured on PETS09-S2L1 (assets/vtest.avi, 768x576,
//! 10 frames a second by its header) with its ground truth: each person's box and their place
//! on the ground in metres (gt.txt: frame, id, x, y, w, h, conf, X, Y, ...; its frame 1 is
//! vidflow's frame 0).
//!
//! The ground-truth boxes stand in for detections, with gaussian jitter on each edge of a share
//! of the box's height (a detector's boxes wander a few pixels frame to frame); each person's
//! boxes go through the tracker's own motion model (`Kalman`, as `smooth` reports them), their
//! bottom centres through the calibration [`IMAGE`] -> [`GROUND`] (fitted to the ground truth:
//! `Ground`), and the places into [`Speeds`] at each window. The truth at a frame is the
//! person's ground-truth place one second later minus one second earlier, over two seconds.
//!
//! Run with `VIDFLOW_PETS_GT=/path/to/gt.txt cargo test --lib speed_pets -- --ignored
//! --nocapture`: it prints the calibration's residual and, per window and jitter, the mean
//! error of each person's mean speed, the mean error of a frame's speed, and the share of
//! frames with a speed.

use std::collections::BTreeMap;

use super::kalman::Kalman;
use super::speed::Speeds;
use crate::frame::Ground;
use crate::value::{BBox, Detection, Track};

/// Four points of vtest.avi's walkway and their ground places (metres, PETS09's frame),
/// spread over the part of the picture people walk in.
const IMAGE: [[f64; 2]; 4] = [
    [137.0, 211.0],
    [700.0, 181.0],
    [709.0, 432.0],
    [146.0, 434.0],
];
const GROUND: [[f64; 2]; 4] = [
    [-6.0, 3.22],
    [3.2, -9.51],
    [-13.28, -14.92],
    [-17.19, -7.61],
];
const SIZE: (i32, i32) = (768, 576);
const FPS: f64 = 10.0;

/// One row of gt.txt: vidflow's frame number, the box and the ground place.
struct Row {
    frame: u64,
    bbox: BBox,
    ground: [f64; 2],
}

fn read(path: &str) -> BTreeMap<u64, Vec<Row>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut people: BTreeMap<u64, Vec<Row>> = BTreeMap::new();
    for line in text.lines() {
        let v: Vec<f64> = line.split(',').map(|s| s.trim().parse().unwrap()).collect();
        people.entry(v[1] as u64).or_default().push(Row {
            frame: v[0] as u64 - 1,
            bbox: BBox {
                x: v[2] as f32,
                y: v[3] as f32,
                width: v[4] as f32,
                height: v[5] as f32,
            },
            ground: [v[7], v[8]],
        });
    }
    for rows in people.values_mut() {
        rows.sort_by_key(|r| r.frame);
    }
    people
}

/// A standard normal number from a xorshift generator (Box-Muller).
fn normal(state: &mut u64) -> f64 {
    let mut uniform = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f64 / (1u64 << 53) as f64
    };
    let (a, b) = (uniform().max(1e-12), uniform());
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// (mean error of each person's mean speed, km/h; the same as a share of the true mean; mean
/// error of a frame's speed, km/h; share of frames with a speed).
fn measure(
    people: &BTreeMap<u64, Vec<Row>>,
    ground: &Ground,
    window_s: f64,
    jitter: f64,
) -> (f64, f64, f64, f64) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let (mut track_err, mut track_rel, mut tracks) = (0.0, 0.0, 0usize);
    let (mut frame_err, mut framed, mut truths) = (0.0, 0usize, 0usize);
    for (&id, rows) in people {
        let at: BTreeMap<u64, [f64; 2]> = rows.iter().map(|r| (r.frame, r.ground)).collect();
        let mut speeds = Speeds::default();
        let mut kalman: Option<(Kalman, u64)> = None;
        let (mut est_sum, mut true_sum, mut n) = (0.0, 0.0, 0usize);
        for r in rows {
            let h = f64::from(r.bbox.height);
            let mut edge = || (normal(&mut state) * jitter * h) as f32;
            let (x0, y0) = (r.bbox.x + edge(), r.bbox.y + edge());
            let (x1, y1) = (
                r.bbox.x + r.bbox.width + edge(),
                r.bbox.y + r.bbox.height + edge(),
            );
            let seen = BBox {
                x: x0,
                y: y0,
                width: x1 - x0,
                height: y1 - y0,
            };
            let k = match &mut kalman {
                Some((k, last)) => {
                    for _ in *last..r.frame {
                        k.predict();
                    }
                    k.update(&seen);
                    *last = r.frame;
                    k
                }
                None => &mut kalman.insert((Kalman::new(&seen), r.frame)).0,
            };
            let mut reported = [Track::new(
                id,
                Detection::new("person".into(), 1.0, k.bbox()),
                false,
            )];
            let now = r.frame as f64 / FPS;
            speeds.measure_at(&mut reported, (Some(ground), SIZE, now), window_s, |_| true);
            let lag = FPS as u64;
            let truth = r
                .frame
                .checked_sub(lag)
                .and_then(|f| at.get(&f))
                .zip(at.get(&(r.frame + lag)))
                .map(|(a, b)| (b[0] - a[0]).hypot(b[1] - a[1]) / 2.0 * 3.6);
            let Some(truth) = truth else { continue };
            truths += 1;
            if let Some(v) = reported[0].speed {
                let v = f64::from(v.value());
                est_sum += v;
                true_sum += truth;
                n += 1;
                frame_err += (v - truth).abs();
                framed += 1;
            }
        }
        if n > 0 {
            let (e, t) = (est_sum / n as f64, true_sum / n as f64);
            track_err += (e - t).abs();
            track_rel += (e - t).abs() / t.max(0.1);
            tracks += 1;
        }
    }
    (
        track_err / tracks as f64,
        track_rel / tracks as f64,
        frame_err / framed as f64,
        framed as f64 / truths as f64,
    )
}

#[test]
#[ignore = "needs PETS09-S2L1's gt.txt, named by VIDFLOW_PETS_GT"]
fn speed_window_on_pets09_ground_truth() {
    let Ok(path) = std::env::var("VIDFLOW_PETS_GT") else {
        return;
    };
    let people = read(&path);
    let ground = Ground::fit((768, 576), &IMAGE, &GROUND).unwrap();
    let residuals: Vec<f64> = people
        .values()
        .flatten()
        .map(|r| {
            let g = ground.to_ground(r.bbox.anchor(), SIZE).unwrap();
            (g[0] - r.ground[0]).hypot(g[1] - r.ground[1])
        })
        .collect();
    let rms = (residuals.iter().map(|r| r * r).sum::<f64>() / residuals.len() as f64).sqrt();
    let worst = residuals.iter().fold(0.0f64, |m, r| m.max(*r));
    println!(
        "calibration over {} gt points: rms {rms:.3} m, worst {worst:.3} m",
        residuals.len()
    );
    println!("jitter  window  person-mean-err km/h (%)  frame-err km/h  frames with speed");
    for jitter in [0.0, 0.02, 0.04] {
        for window in [0.5, 1.0, 1.5, 2.0, 3.0] {
            let (e, rel, f, share) = measure(&people, &ground, window, jitter);
            println!(
                "{jitter:.2}    {window:.1}     {e:.2} ({:.1}%)               {f:.2}            {:.0}%",
                rel * 100.0,
                share * 100.0
            );
        }
    }
}
