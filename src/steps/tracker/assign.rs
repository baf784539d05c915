//! Which detection belongs to which track: the assignment that maximises the total IoU over the
//! pairs that overlap at least the threshold, found exactly by the Hungarian algorithm.
//!
//! Why not greedy (the highest IoU first): two objects crossing paths give a track two
//! overlapping candidates, and the greedy choice of one pair can leave the other track with
//! nothing when a slightly worse pair for both would have matched both. The exact assignment
//! costs O(n^3) on n = tracks + detections: well under a millisecond for the tens of objects of
//! a camera frame.
//!
//! The problem is made square so that "unmatched" is a choice: each track may take a dummy
//! detection and each detection a dummy track, each at cost `(1 - min_iou) / 2`, and a real
//! pair costs `1 - IoU`. A real pair then beats leaving both unmatched exactly when its IoU is at
//! least `min_iou`, and the minimum total cost is the maximum total of `IoU - min_iou` over the
//! matched pairs. Pairs under the threshold are forbidden outright.

/// A pair that may never be chosen.
const FORBIDDEN: f64 = 1e9;

/// Matches rows (tracks) to columns (detections) given `iou[row][col]`; returns the matched
/// `(row, col)` pairs, each row and column at most once, every pair at least `min_iou`.
pub(super) fn match_by_iou(iou: &[Vec<f32>], columns: usize, min_iou: f32) -> Vec<(usize, usize)> {
    let rows = iou.len();
    if rows == 0 || columns == 0 {
        return Vec::new();
    }
    let n = rows + columns;
    let unmatched = (1.0 - f64::from(min_iou)) / 2.0;
    let cost = |r: usize, c: usize| -> f64 {
        match (r < rows, c < columns) {
            (true, true) => {
                let v = f64::from(iou[r][c]);
                if v >= f64::from(min_iou) && v > 0.0 {
                    1.0 - v
                } else {
                    FORBIDDEN
                }
            }
            (true, false) | (false, true) => unmatched,
            (false, false) => 0.0,
        }
    };
    hungarian(n, cost)
        .into_iter()
        .enumerate()
        .filter(|&(r, c)| r < rows && c < columns && cost(r, c) < FORBIDDEN)
        .collect()
}

/// The minimum-cost perfect assignment of an `n x n` matrix: `result[row] = column`.
/// Shortest augmenting paths with potentials (Kuhn-Munkres in the Jonker-Volgenant form).
fn hungarian(n: usize, cost: impl Fn(usize, usize) -> f64) -> Vec<usize> {
    // 1-based internally: index 0 is the virtual start of each augmenting path.
    let mut u = vec![0.0; n + 1];
    let mut v = vec![0.0; n + 1];
    let mut row_of = vec![0usize; n + 1];
    let mut way = vec![0usize; n + 1];
    for i in 1..=n {
        row_of[0] = i;
        let mut j0 = 0;
        let mut min = vec![f64::INFINITY; n + 1];
        let mut used = vec![false; n + 1];
        loop {
            used[j0] = true;
            let i0 = row_of[j0];
            let mut delta = f64::INFINITY;
            let mut j1 = 0;
            for j in 1..=n {
                if used[j] {
                    continue;
                }
                let reduced = cost(i0 - 1, j - 1) - u[i0] - v[j];
                if reduced < min[j] {
                    min[j] = reduced;
                    way[j] = j0;
                }
                if min[j] < delta {
                    delta = min[j];
                    j1 = j;
                }
            }
            for j in 0..=n {
                if used[j] {
                    u[row_of[j]] += delta;
                    v[j] -= delta;
                } else {
                    min[j] -= delta;
                }
            }
            j0 = j1;
            if row_of[j0] == 0 {
                break;
            }
        }
        while j0 != 0 {
            let j1 = way[j0];
            row_of[j0] = row_of[j1];
            j0 = j1;
        }
    }
    let mut result = vec![0; n];
    for j in 1..=n {
        if row_of[j] > 0 {
            result[row_of[j] - 1] = j - 1;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_total_wins_over_the_best_single_pair() {
        // Greedy takes (0, 0) at 0.9 and leaves track 1 unmatched; the exact answer matches
        // both.
        let iou = vec![vec![0.9, 0.8], vec![0.85, 0.0]];
        let mut m = match_by_iou(&iou, 2, 0.3);
        m.sort_unstable();
        assert_eq!(m, vec![(0, 1), (1, 0)]);
    }

    #[test]
    fn pairs_under_the_threshold_stay_unmatched() {
        let iou = vec![vec![0.2, 0.0], vec![0.0, 0.5]];
        assert_eq!(match_by_iou(&iou, 2, 0.3), vec![(1, 1)]);
        assert!(match_by_iou(&[vec![0.0; 3]], 3, 0.3).is_empty());
        assert!(match_by_iou(&[], 3, 0.3).is_empty());
    }

    #[test]
    fn more_detections_than_tracks_and_the_other_way() {
        let iou = vec![vec![0.1, 0.7, 0.4]];
        assert_eq!(match_by_iou(&iou, 3, 0.3), vec![(0, 1)]);
        let iou = vec![vec![0.4], vec![0.6], vec![0.5]];
        assert_eq!(match_by_iou(&iou, 1, 0.3), vec![(1, 0)]);
    }

    /// Every permutation of `0..n`.
    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, n - 1);
                out.push(q);
            }
        }
        out
    }

    #[test]
    fn hungarian_finds_the_minimum_that_trying_every_assignment_finds() {
        // Pseudo-random 6x6 matrices (a fixed linear congruential sequence).
        let mut seed: u64 = 7;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 40) as f64 / (1u64 << 24) as f64
        };
        for _ in 0..50 {
            let c: Vec<Vec<f64>> = (0..6).map(|_| (0..6).map(|_| next()).collect()).collect();
            let r = hungarian(6, |i, j| c[i][j]);
            let mut seen = r.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..6).collect::<Vec<_>>(), "not a permutation: {r:?}");
            let total: f64 = r.iter().enumerate().map(|(i, &j)| c[i][j]).sum();
            let best = permutations(6)
                .iter()
                .map(|p| p.iter().enumerate().map(|(i, &j)| c[i][j]).sum::<f64>())
                .fold(f64::INFINITY, f64::min);
            assert!((total - best).abs() < 1e-9, "{total} > {best}");
        }
    }
}
