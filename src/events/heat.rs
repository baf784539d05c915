//! Heatmaps and occupancy, as the writer keeps them: per source and label, the seconds objects
//! stood at each place of the picture (`heatmap`), and per zone the time-weighted number of
//! objects inside (`occupancy`), both by minute.
//!
//! A frame counts for its time step `dt` (`writer.rs`: the time since its source's previous
//! frame that reached the store, in stream time, at most [`MAX_STEP`]). Each seen (not
//! predicted) track of a tracker adds `dt` to a [`COLS`] x [`ROWS`] grid over the picture at its
//! box's bottom centre (where it stands, in the frame's pixels: a tracker fed by `resize` has
//! its boxes placed back on the frame), shared among the four cells around it ([`shares`]);
//! each zone of a `zone_count` adds
//! `n * dt` and `dt` (their ratio is the mean objects inside) and keeps the most at once.
//!
//! Size: a `heatmap` row holds a [`CELL_BYTES`] entry per cell that had someone in that minute
//! (a cell's index and seconds), so a source takes at most 1440 minutes x [`MAX_LABELS`]
//! labels x 768 cells x 6 bytes = 53 MB a day (every cell of every label busy every minute);
//! a label past the first [`MAX_LABELS`] of a source is not mapped (said once).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rusqlite::{OptionalExtension, Transaction, params};

use super::Facts;

/// Columns of the grid.
pub const COLS: usize = 32;
/// Rows of the grid.
pub const ROWS: usize = 24;
/// Bytes a busy cell takes in a row: its index (u16) and seconds (f32), little-endian.
pub const CELL_BYTES: usize = 6;
/// Labels mapped per source: a bound on the heatmap's size (see the module header).
pub const MAX_LABELS: usize = 8;
/// The most one frame counts for: a longer gap (frames without facts, a stall, a reconnection)
/// counts as the frame's nominal interval.
pub const MAX_STEP: f64 = 1.0;

/// A heatmap's cells: index (row-major) to seconds.
pub type Cells = BTreeMap<u16, f32>;

/// The sparse blob of `cells`.
pub fn encode(cells: &Cells) -> Vec<u8> {
    let mut out = Vec::with_capacity(cells.len() * CELL_BYTES);
    for (i, s) in cells {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// Adds the cells of a blob to `into` (a short tail is ignored).
pub fn add_blob(into: &mut Cells, blob: &[u8]) {
    for c in blob.chunks_exact(CELL_BYTES) {
        let i = u16::from_le_bytes([c[0], c[1]]);
        let s = f32::from_le_bytes([c[2], c[3], c[4], c[5]]);
        *into.entry(i).or_default() += s;
    }
}

/// The cells around a box's bottom centre (`x`, `bottom` in pixels of a `width` x `height`
/// picture) and each one's share of its time, bilinear between the cells' centres: a place on
/// the edge of two cells is shared between them, so a person standing still on an edge is not
/// given to whichever side a pixel of the box's jitter puts them. The shares sum to 1; past the
/// outer cells' centres, the outer cells take it all. At a cell's centre, that cell has it all.
pub fn shares(x: f32, bottom: f32, width: i32, height: i32) -> [(u16, f32); 4] {
    // Along one axis: the two cells around `v` and the second one's share.
    let axis = |v: f32, size: i32, n: usize| {
        let g = (v / size.max(1) as f32 * n as f32 - 0.5).clamp(0.0, (n - 1) as f32);
        let first = g.floor();
        let i = first as usize;
        (i, (i + 1).min(n - 1), g - first)
    };
    let (c0, c1, fx) = axis(x, width, COLS);
    let (r0, r1, fy) = axis(bottom, height, ROWS);
    let at = |r: usize, c: usize| (r * COLS + c) as u16;
    [
        (at(r0, c0), (1.0 - fx) * (1.0 - fy)),
        (at(r0, c1), fx * (1.0 - fy)),
        (at(r1, c0), (1.0 - fx) * fy),
        (at(r1, c1), fx * fy),
    ]
}

/// One heatmap row being added to: the picture's size and the cells' seconds.
#[derive(Debug, Default)]
struct HeatRow {
    size: (i32, i32),
    cells: Cells,
}

/// One zone's occupancy in one minute.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Occupied {
    /// Objects inside times seconds.
    pub object_s: f64,
    /// Seconds of frames counted.
    pub seconds: f64,
    pub max: u64,
}

/// A zone's minute: source, step, zone, minute.
type ZoneMinute = (Arc<str>, Arc<str>, Arc<str>, i64);

/// What a batch adds to `heatmap` and `occupancy`, written at its end ([`Areas::write`]).
#[derive(Debug, Default)]
pub(super) struct Areas {
    heat: HashMap<(Arc<str>, Arc<str>, i64), HeatRow>,
    occupancy: HashMap<ZoneMinute, Occupied>,
    /// The labels mapped per source (at most [`MAX_LABELS`]), from the store the first time.
    labels: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    said: bool,
}

impl Areas {
    /// Adds a frame's tracks and zone counts, at frame time `at` (ms) for `dt` seconds.
    pub(super) fn add(&mut self, tx: &Transaction<'_>, facts: &Facts, at: i64, dt: f64) {
        let minute = at.div_euclid(60_000);
        let source = &facts.source;
        for (step, counts) in &facts.occupancy {
            for (zone, &n) in &counts.0 {
                let key = (source.clone(), step.clone(), zone.clone(), minute);
                let o = self.occupancy.entry(key).or_default();
                o.object_s += n as f64 * dt;
                o.seconds += dt;
                o.max = o.max.max(n);
            }
        }
        let (w, h) = facts.size;
        for (_, tracks, place) in &facts.tracks {
            for t in tracks.iter().filter(|t| !t.predicted) {
                let label = &t.detection.class;
                if !self.mapped(tx, source, label, minute) {
                    continue;
                }
                let b = &t.detection.bbox;
                let [x, y, bw, bh] = place.rect([b.x, b.y, b.width, b.height]);
                let row = self
                    .heat
                    .entry((source.clone(), label.clone(), minute))
                    .or_default();
                row.size = (w, h);
                for (i, share) in shares(x + bw / 2.0, y + bh, w, h) {
                    if share > 0.0 {
                        *row.cells.entry(i).or_default() += share * dt as f32;
                    }
                }
            }
        }
    }

    /// Whether `label` is among the labels of `source` that are mapped (see [`MAX_LABELS`]).
    fn mapped(
        &mut self,
        tx: &Transaction<'_>,
        source: &Arc<str>,
        label: &Arc<str>,
        minute: i64,
    ) -> bool {
        let labels = self.labels.entry(source.clone()).or_insert_with(|| {
            // Those the store kept for the last day count.
            let mut stmt = match tx.prepare_cached(
                "SELECT DISTINCT label FROM heatmap WHERE source = ?1 AND minute >= ?2",
            ) {
                Ok(s) => s,
                Err(_) => return BTreeSet::new(),
            };
            stmt.query_map(params![&**source, minute - 1440], |r| r.get::<_, String>(0))
                .map(|rows| rows.filter_map(Result::ok).map(Arc::from).collect())
                .unwrap_or_default()
        });
        if labels.contains(label) {
            return true;
        }
        if labels.len() < MAX_LABELS {
            labels.insert(label.clone());
            return true;
        }
        if !self.said {
            self.said = true;
            tracing::warn!(source = %source, label = %label, "event store: a heatmap maps at most {MAX_LABELS} labels per source; label \"{label}\" is not mapped (said once)");
        }
        false
    }

    /// Adds what the batch gathered to the store's rows, and forgets it.
    pub(super) fn write(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        let mut occ = tx.prepare_cached(
            "INSERT INTO occupancy (source, step, place, minute, object_s, seconds, max)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (source, step, place, minute) DO UPDATE SET
               object_s = object_s + excluded.object_s, seconds = seconds + excluded.seconds,
               max = MAX(max, excluded.max)",
        )?;
        for ((source, step, place, minute), o) in self.occupancy.drain() {
            occ.execute(params![
                &*source,
                &*step,
                &*place,
                minute,
                o.object_s,
                o.seconds,
                i64::try_from(o.max).unwrap_or(i64::MAX)
            ])?;
        }
        let mut old = tx.prepare_cached(
            "SELECT cells FROM heatmap WHERE source = ?1 AND label = ?2 AND minute = ?3",
        )?;
        let mut put = tx.prepare_cached(
            "INSERT OR REPLACE INTO heatmap (source, label, minute, width, height, cells)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for ((source, label, minute), mut row) in self.heat.drain() {
            let blob: Option<Vec<u8>> = old
                .query_row(params![&*source, &*label, minute], |r| r.get(0))
                .optional()?;
            if let Some(blob) = blob {
                add_blob(&mut row.cells, &blob);
            }
            let (w, h) = row.size;
            put.execute(params![&*source, &*label, minute, w, h, encode(&row.cells)])?;
        }
        Ok(())
    }

    /// Forgets what a failed batch gathered (its transaction was rolled back).
    pub(super) fn clear(&mut self) {
        self.heat.clear();
        self.occupancy.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_shared_among_the_cells_around_it_by_nearness() {
        let sum = |s: [(u16, f32); 4]| s.iter().map(|(_, w)| w).sum::<f32>();
        let of = |s: [(u16, f32); 4], cell: usize| -> f32 {
            s.iter()
                .filter(|(i, _)| *i as usize == cell)
                .map(|(_, w)| w)
                .sum()
        };
        // 20 px a cell: (330, 250) is the centre of column 16, row 12: all of it there.
        let centre = shares(330.0, 250.0, 640, 480);
        assert_eq!(of(centre, 12 * COLS + 16), 1.0);
        // On the edge between columns 16 and 17 (x = 340): half each, whichever pixel.
        let edge = shares(340.0, 250.0, 640, 480);
        assert_eq!(of(edge, 12 * COLS + 16), 0.5);
        assert_eq!(of(edge, 12 * COLS + 17), 0.5);
        let (left, right) = (
            shares(339.0, 250.0, 640, 480),
            shares(341.0, 250.0, 640, 480),
        );
        assert!((of(left, 12 * COLS + 16) - of(right, 12 * COLS + 17)).abs() < 1e-6);
        assert!((of(left, 12 * COLS + 16) - 0.55).abs() < 1e-6);
        // A quarter of the way between four centres.
        let q = shares(335.0, 255.0, 640, 480);
        assert!((of(q, 12 * COLS + 16) - 0.5625).abs() < 1e-6);
        assert!((of(q, 13 * COLS + 17) - 0.0625).abs() < 1e-6);
        // The corners and past them: the outer cell takes it all.
        assert_eq!(of(shares(0.0, 0.0, 640, 480), 0), 1.0);
        assert_eq!(of(shares(9999.0, 9999.0, 640, 480), COLS * ROWS - 1), 1.0);
        for (x, y) in [(1.0, 2.0), (333.3, 17.0), (639.0, 479.0), (-5.0, 600.0)] {
            assert!((sum(shares(x, y, 640, 480)) - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn blobs_of_cells_add_up() {
        let cells: Cells = [(3, 1.5), (700, 0.25)].into_iter().collect();
        let blob = encode(&cells);
        assert_eq!(blob.len(), 2 * CELL_BYTES);
        let mut sum = Cells::new();
        add_blob(&mut sum, &blob);
        add_blob(&mut sum, &blob);
        assert_eq!(sum, [(3, 3.0), (700, 0.5)].into_iter().collect());
    }
}
