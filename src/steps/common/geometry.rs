//! Plane geometry shared by the zone and line kinds (`zone_count`, `line_counter`, `filter`):
//! points lists parsed from `[[x, y], ...]` with line:column errors, polygon containment,
//! which side of a line a point is on, and whether a path crosses a segment.
//!
//! Coordinates are pixels of the image the boxes were found in, x to the right, y down.

use serde::Deserialize;

use crate::frame::Format;
use crate::spec::{Diagnostic, ParamDoc};
use crate::value::BBox;

/// A point `[x, y]` in pixels.
pub(in crate::steps) type Point = [f32; 2];

/// `[[x, y], ...]` as the user typed it, every level with its place in the file.
pub(in crate::steps) type RawPoints = toml::Spanned<Vec<toml::Spanned<Vec<toml::Spanned<f64>>>>>;

/// The point of a box that zones and lines test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(in crate::steps) enum Anchor {
    /// Where a person or vehicle touches the ground ([`BBox::anchor`]).
    #[default]
    BottomCenter,
    /// The middle of the box (faces, objects seen from above).
    Center,
}

impl Anchor {
    pub(in crate::steps) fn of(self, b: &BBox) -> Point {
        match self {
            Self::BottomCenter => b.anchor(),
            Self::Center => [b.x + b.width / 2.0, b.y + b.height / 2.0],
        }
    }
}

/// The `anchor` parameter, as `vidflow steps` documents it.
pub(in crate::steps) const ANCHOR_DOC: ParamDoc = ParamDoc {
    name: "anchor",
    ty: "\"bottom_center\" | \"center\"",
    default: "\"bottom_center\"",
    doc: "the point of a box tested against zones and lines",
};

/// The `classes` parameter of the counting kinds.
pub(in crate::steps) const CLASSES_DOC: ParamDoc = ParamDoc {
    name: "classes",
    ty: "list of strings",
    default: "all",
    doc: "classes counted; tracks of other classes are ignored",
};

/// Turns `[[x, y], ...]` into points: every point exactly two finite numbers, and at least
/// `min` and at most `max` points. `what` names the list in messages ("zone \"door\"").
pub(in crate::steps) fn parse_points(
    raw: &RawPoints,
    what: &str,
    min: usize,
    max: usize,
) -> Result<Vec<Point>, Diagnostic> {
    let points = raw.get_ref();
    if points.len() < min || points.len() > max {
        let wanted = if min == max {
            format!("exactly {min}")
        } else {
            format!("at least {min}")
        };
        return Err(Diagnostic::at(
            raw.span(),
            format!("{what} needs {wanted} points [x, y], not {}", points.len()),
        ));
    }
    points
        .iter()
        .map(|p| {
            let [x, y] = p.get_ref().as_slice() else {
                return Err(Diagnostic::at(
                    p.span(),
                    format!(
                        "{what}: a point is [x, y], two numbers, not {}",
                        p.get_ref().len()
                    ),
                ));
            };
            Ok([coordinate(x, what)?, coordinate(y, what)?])
        })
        .collect()
}

fn coordinate(n: &toml::Spanned<f64>, what: &str) -> Result<f32, Diagnostic> {
    let v = *n.get_ref();
    if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
        return Err(Diagnostic::at(
            n.span(),
            format!("{what}: coordinate {v} is not a finite number"),
        ));
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "pixel coordinates, range checked above"
    )]
    Ok(v as f32)
}

/// A closed polygon (the last point joins the first).
#[derive(Debug, Clone)]
pub(in crate::steps) struct Polygon {
    points: Vec<Point>,
}

impl Polygon {
    /// A polygon of the parsed `points` (at least 3).
    pub(in crate::steps) fn new(points: Vec<Point>) -> Self {
        Self { points }
    }

    pub(in crate::steps) fn points(&self) -> &[Point] {
        &self.points
    }

    /// Parses a zone `[[x, y], ...]` of at least 3 points.
    pub(in crate::steps) fn parse(raw: &RawPoints, what: &str) -> Result<Self, Diagnostic> {
        parse_points(raw, what, 3, usize::MAX).map(Self::new)
    }

    /// Whether `p` is inside (even-odd rule: a ray to the right crosses the edges an odd number
    /// of times). A point exactly on an edge is inside for one of the two polygons that could
    /// share that edge and outside for the other (for a rectangle: left and top edges in, right
    /// and bottom edges out), so two zones side by side never both hold it.
    pub(in crate::steps) fn contains(&self, p: Point) -> bool {
        let [x, y] = p;
        let mut inside = false;
        let n = self.points.len();
        for i in 0..n {
            let [xi, yi] = self.points[i];
            let [xj, yj] = self.points[(i + n - 1) % n];
            if (yi > y) != (yj > y) {
                let x_cross = xi + (y - yi) * (xj - xi) / (yj - yi);
                if x < x_cross {
                    inside = !inside;
                }
            }
        }
        inside
    }
}

/// A segment from `a` (point 1) to `b` (point 2).
#[derive(Debug, Clone, Copy)]
pub(in crate::steps) struct Segment {
    pub(in crate::steps) a: Point,
    pub(in crate::steps) b: Point,
}

impl Segment {
    /// Parses a line `[[x1, y1], [x2, y2]]` of two distinct points.
    pub(in crate::steps) fn parse(raw: &RawPoints, what: &str) -> Result<Self, Diagnostic> {
        let points = parse_points(raw, what, 2, 2)?;
        let (a, b) = (points[0], points[1]);
        if a == b {
            return Err(Diagnostic::at(
                raw.span(),
                format!("{what}: its two points are the same"),
            ));
        }
        Ok(Self { a, b })
    }

    /// Signed distance of `p` from the line through the segment, in pixels: positive on the
    /// right of the direction from `a` to `b` as seen on the image (y down), negative on its left.
    pub(in crate::steps) fn side(&self, p: Point) -> f32 {
        let (dx, dy) = (self.b[0] - self.a[0], self.b[1] - self.a[1]);
        (dx * (p[1] - self.a[1]) - dy * (p[0] - self.a[0])) / dx.hypot(dy)
    }

    /// Whether the path from `p` to `q` meets the segment itself (not its extension).
    pub(in crate::steps) fn crossed_by(&self, p: Point, q: Point) -> bool {
        let path = Self { a: p, b: q };
        let (d1, d2) = (self.cross(p), self.cross(q));
        let (d3, d4) = (path.cross(self.a), path.cross(self.b));
        let straddles = |u: f32, v: f32| (u <= 0.0 && v >= 0.0) || (u >= 0.0 && v <= 0.0);
        p != q && straddles(d1, d2) && straddles(d3, d4)
    }

    /// The unnormalised cross product of the direction with `p - a`.
    fn cross(&self, p: Point) -> f32 {
        (self.b[0] - self.a[0]) * (p[1] - self.a[1]) - (self.b[1] - self.a[1]) * (p[0] - self.a[0])
    }
}

/// What a change of the source's size from `from` to `to` means for `places` ("its zones are",
/// "its line is") given in pixels: they stay at the same pixels, on another part of the scene.
pub(in crate::steps) fn stay_in_pixels(places: &str, from: Format, to: Format) -> String {
    let scale = |a: i32, b: i32| f64::from(b) / f64::from(a.max(1));
    format!(
        "{places} in pixels and stay at the same pixels, which now show another part of the \
         scene ({}x{} is {:.2} times as wide and {:.2} times as high as {}x{}); counting goes on \
         there: if the camera's view is the same, redraw for {}x{} and reload",
        to.width,
        to.height,
        scale(from.width, to.width),
        scale(from.height, to.height),
        from.width,
        from.height,
        to.width,
        to.height
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Result<Vec<Point>, Diagnostic> {
        #[derive(Deserialize)]
        struct T {
            p: RawPoints,
        }
        let t: T = toml::from_str(&format!("p = {text}")).unwrap();
        parse_points(&t.p, "zone \"z\"", 3, usize::MAX)
    }

    #[test]
    fn points_are_numbers_integers_included() {
        assert_eq!(
            raw("[[0, 0], [10.5, 0], [0, 10]]").unwrap(),
            vec![[0.0, 0.0], [10.5, 0.0], [0.0, 10.0]]
        );
        let short = raw("[[0, 0], [10, 0]]").unwrap_err();
        assert!(short.message.contains("at least 3 points"), "{short:?}");
        let three = raw("[[0, 0], [10, 0, 1], [0, 10]]").unwrap_err();
        assert!(three.message.contains("two numbers, not 3"), "{three:?}");
        let nan = raw("[[0, 0], [nan, 0], [0, 10]]").unwrap_err();
        assert!(nan.message.contains("not a finite number"), "{nan:?}");
    }

    #[test]
    fn a_square_holds_its_inside_and_not_its_outside() {
        let square = Polygon::new(vec![[0.0, 0.0], [10.0, 0.0], [10.0, 10.0], [0.0, 10.0]]);
        assert!(square.contains([5.0, 5.0]));
        assert!(square.contains([0.5, 9.5]));
        assert!(!square.contains([-0.5, 5.0]));
        assert!(!square.contains([10.5, 5.0]));
        assert!(!square.contains([5.0, 10.5]));
        assert!(!square.contains([5.0, -0.5]));
        // Edges: left and top in, right and bottom out.
        assert!(square.contains([0.0, 5.0]) && square.contains([5.0, 0.0]));
        assert!(!square.contains([10.0, 5.0]) && !square.contains([5.0, 10.0]));
    }

    #[test]
    fn a_concave_polygon_excludes_its_notch() {
        // A "U": the notch between x 4..6 above y 6 is outside.
        let u = Polygon::new(vec![
            [0.0, 0.0],
            [4.0, 0.0],
            [4.0, 6.0],
            [6.0, 6.0],
            [6.0, 0.0],
            [10.0, 0.0],
            [10.0, 10.0],
            [0.0, 10.0],
        ]);
        assert!(!u.contains([5.0, 3.0]));
        assert!(u.contains([2.0, 3.0]));
        assert!(u.contains([5.0, 8.0]));
    }

    #[test]
    fn the_right_of_the_direction_is_positive_with_y_down() {
        // From left to right: below on the image is the right-hand side.
        let line = Segment {
            a: [0.0, 0.0],
            b: [10.0, 0.0],
        };
        assert_eq!(line.side([5.0, 3.0]), 3.0);
        assert_eq!(line.side([5.0, -2.0]), -2.0);
    }

    #[test]
    fn only_the_segment_is_crossed_not_its_extension() {
        let line = Segment {
            a: [0.0, 0.0],
            b: [10.0, 0.0],
        };
        assert!(line.crossed_by([5.0, -1.0], [5.0, 1.0]));
        assert!(line.crossed_by([-1.0, -1.0], [1.0, 1.0]));
        assert!(!line.crossed_by([15.0, -1.0], [15.0, 1.0]));
        assert!(!line.crossed_by([5.0, 1.0], [5.0, 3.0]));
    }
}
