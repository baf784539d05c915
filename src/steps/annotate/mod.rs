//! `annotate`: draws detections, tracks (with their IDs, speeds and time in zones), zones, lines
//! and counts on a copy of an image.
//!
//! Every drawn input is optional: on a frame where one has no value (its step was skipped, or
//! ended its branch) nothing is drawn for it and the rest is still drawn. Zones and lines are
//! given in the same pixel coordinates as the counting steps (`zone_count`, `line_counter`), so
//! a user copies them from one table to the other.

use std::collections::BTreeMap;

use opencv::core::{Mat, MatTraitConst, Point, Rect, Scalar, Vector};
use opencv::imgproc;
use serde::Deserialize;
use toml::Spanned;

use super::{Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Counts, Speed, Track, Value, ValueType};

pub(super) static KIND: StepKind = StepKind {
    name: "annotate",
    summary: "draw detections, tracks with their IDs, zones, lines and counts on a copy of the image",
    inputs: &[
        Port {
            name: "image",
            ty: ValueType::Image,
            optional: false,
        },
        Port {
            name: "detections",
            ty: ValueType::Detections,
            optional: true,
        },
        Port {
            name: "tracks",
            ty: ValueType::Tracks,
            optional: true,
        },
        Port {
            name: "counts",
            ty: ValueType::Counts,
            optional: true,
        },
    ],
    outputs: super::IMAGE_OUT,
    params: &[
        ParamDoc {
            name: "color",
            ty: "[b, g, r]",
            default: "[0, 255, 0]",
            doc: "colour of detections, zones and lines (each track has its own colour)",
        },
        ParamDoc {
            name: "thickness",
            ty: "integer in [1, 50]",
            default: "2",
            doc: "line width in pixels (predicted tracks are drawn dashed)",
        },
        ParamDoc {
            name: "zones",
            ty: "table of NAME = [[x, y], ...]",
            default: "none",
            doc: "polygons to draw with their names, as given to zone_count",
        },
        ParamDoc {
            name: "lines",
            ty: "list of [[x1, y1], [x2, y2]]",
            default: "none",
            doc: "segments to draw, as given to line_counter (point 1 marked by a dot)",
        },
    ],
    stateful: false,
    build,
};

/// Ports, in [`KIND`]'s order.
const DETECTIONS: usize = 1;
const TRACKS: usize = 2;
const COUNTS: usize = 3;

/// Label text size (OpenCV's Hershey scale).
const FONT_SCALE: f64 = 0.45;
/// Dash and gap length of a predicted track's box, in pixels.
const DASH: i32 = 6;
/// The counts panel's margin from the image corner and around its text, in pixels.
const PANEL_MARGIN: i32 = 6;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    color: Option<[u8; 3]>,
    thickness: Option<Spanned<i32>>,
    zones: Option<BTreeMap<String, Spanned<Vec<[f32; 2]>>>>,
    lines: Option<Vec<Spanned<[[f32; 2]; 2]>>>,
}

#[derive(Debug)]
struct Annotate {
    color: Scalar,
    thickness: i32,
    zones: Vec<(String, Vec<Point>)>,
    lines: Vec<[Point; 2]>,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let input = params.require_one_input(&["detections", "tracks", "counts"]);
    let c: Config = params.parse()?;
    if c.zones.is_none() && c.lines.is_none() {
        input.map_err(|d| Diagnostic {
            message: format!("nothing to draw: {}, or \"zones\" or \"lines\"", d.message),
            ..d
        })?;
    }
    let [b, g, r] = c.color.unwrap_or([0, 255, 0]);
    let thickness = match c.thickness {
        Some(t) if !(1..=50).contains(t.get_ref()) => {
            return Err(Diagnostic::at(
                t.span(),
                "thickness must be between 1 and 50",
            ));
        }
        Some(t) => t.into_inner(),
        None => 2,
    };
    let mut zones = Vec::new();
    for (name, polygon) in c.zones.unwrap_or_default() {
        if polygon.get_ref().len() < 3 {
            return Err(Diagnostic::at(
                polygon.span(),
                format!("zone \"{name}\" needs at least 3 points"),
            ));
        }
        zones.push((name, polygon.get_ref().iter().map(|&p| point(p)).collect()));
    }
    let lines = c
        .lines
        .unwrap_or_default()
        .into_iter()
        .map(|l| l.into_inner().map(point))
        .collect();
    Ok(Box::new(Annotate {
        color: Scalar::new(f64::from(b), f64::from(g), f64::from(r), 0.0),
        thickness,
        zones,
        lines,
    }))
}

fn point([x, y]: [f32; 2]) -> Point {
    Point::new(x.round() as i32, y.round() as i32)
}

fn rect(b: &BBox) -> Rect {
    Rect::new(b.x as i32, b.y as i32, b.width as i32, b.height as i32)
}

/// A colour of its own for each track ID, the same in every frame and every run: hues spread
/// by the golden ratio, fully saturated, so that neighbouring IDs differ.
fn track_color(id: u64) -> Scalar {
    let hue = (id as f64 * 0.618_033_988_749_895).fract() * 6.0;
    let x = 1.0 - (hue % 2.0 - 1.0).abs();
    let (r, g, b) = match hue as u32 {
        0 => (1.0, x, 0.0),
        1 => (x, 1.0, 0.0),
        2 => (0.0, 1.0, x),
        3 => (0.0, x, 1.0),
        4 => (x, 0.0, 1.0),
        _ => (1.0, 0.0, x),
    };
    let level = |c: f64| (c * 255.0).round();
    Scalar::new(level(b), level(g), level(r), 0.0)
}

impl Annotate {
    fn label(&self, canvas: &mut Mat, text: &str, at: Point, color: Scalar) -> opencv::Result<()> {
        let origin = Point::new(at.x, (at.y - 4).max(12));
        imgproc::put_text(
            canvas,
            text,
            origin,
            imgproc::FONT_HERSHEY_SIMPLEX,
            FONT_SCALE,
            color,
            1,
            imgproc::LINE_8,
            false,
        )
    }

    fn zones_and_lines(&self, canvas: &mut Mat) -> opencv::Result<()> {
        for (name, polygon) in &self.zones {
            let points: Vector<Point> = polygon.iter().copied().collect();
            let contours: Vector<Vector<Point>> = std::iter::once(points).collect();
            imgproc::polylines(
                canvas,
                &contours,
                true,
                self.color,
                self.thickness,
                imgproc::LINE_8,
                0,
            )?;
            if let Some(&first) = polygon.first() {
                self.label(canvas, name, first, self.color)?;
            }
        }
        for &[a, b] in &self.lines {
            imgproc::line(canvas, a, b, self.color, self.thickness, imgproc::LINE_8, 0)?;
            imgproc::circle(
                canvas,
                a,
                self.thickness + 2,
                self.color,
                imgproc::FILLED,
                imgproc::LINE_8,
                0,
            )?;
        }
        Ok(())
    }

    fn tracks(&self, canvas: &mut Mat, tracks: &[Track]) -> opencv::Result<()> {
        for t in tracks {
            let color = track_color(t.track_id);
            let r = rect(&t.detection.bbox);
            if t.predicted {
                dashed_rect(canvas, r, color, self.thickness)?;
            } else {
                imgproc::rectangle(canvas, r, color, self.thickness, imgproc::LINE_8, 0)?;
            }
            self.label(canvas, &track_label(t), Point::new(r.x, r.y), color)?;
        }
        Ok(())
    }

    /// One line of text in the top-left corner, white on black: "in 3  out 5".
    fn counts(&self, canvas: &mut Mat, counts: &Counts) -> opencv::Result<()> {
        let text = counts
            .0
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join("  ");
        if text.is_empty() {
            return Ok(());
        }
        let mut baseline = 0;
        let size = imgproc::get_text_size(
            &text,
            imgproc::FONT_HERSHEY_SIMPLEX,
            FONT_SCALE * 1.5,
            self.thickness,
            &mut baseline,
        )?;
        let panel = Rect::new(
            PANEL_MARGIN,
            PANEL_MARGIN,
            size.width + 2 * PANEL_MARGIN,
            size.height + baseline + 2 * PANEL_MARGIN,
        );
        imgproc::rectangle(
            canvas,
            panel,
            Scalar::all(0.0),
            imgproc::FILLED,
            imgproc::LINE_8,
            0,
        )?;
        imgproc::put_text(
            canvas,
            &text,
            Point::new(2 * PANEL_MARGIN, 2 * PANEL_MARGIN + size.height),
            imgproc::FONT_HERSHEY_SIMPLEX,
            FONT_SCALE * 1.5,
            Scalar::all(255.0),
            self.thickness,
            imgproc::LINE_8,
            false,
        )
    }
}

/// A track's label: its class and ID, then its speed when it has one (`person #3 5.1 km/h`,
/// `car #4 42 px/s`) and the whole seconds it has been in each zone it is in (`door 12 s`).
fn track_label(t: &Track) -> String {
    let mut text = format!("{} #{}", t.detection.class, t.track_id);
    match t.speed {
        Some(Speed::Kmh(v)) => text += &format!(" {v:.1} km/h"),
        Some(Speed::PxPerS(v)) => text += &format!(" {v:.0} px/s"),
        None => {}
    }
    for (zone, seconds) in t.dwell.iter().flat_map(|d| d.iter()) {
        text += &format!(" {zone} {seconds:.0} s");
    }
    text
}

/// A rectangle drawn as dashes (a predicted track: where the object should be, not where it
/// was seen).
fn dashed_rect(canvas: &mut Mat, r: Rect, color: Scalar, thickness: i32) -> opencv::Result<()> {
    // As `imgproc::rectangle` draws a `Rect`: its right and bottom edges are inside it.
    let (right, bottom) = (r.x + r.width - 1, r.y + r.height - 1);
    let corners = [
        Point::new(r.x, r.y),
        Point::new(right, r.y),
        Point::new(right, bottom),
        Point::new(r.x, bottom),
    ];
    for i in 0..4 {
        let (a, b) = (corners[i], corners[(i + 1) % 4]);
        let length = (b.x - a.x).abs().max((b.y - a.y).abs());
        let (dx, dy) = ((b.x - a.x).signum(), (b.y - a.y).signum());
        let mut at = 0;
        while at < length {
            let end = (at + DASH).min(length);
            imgproc::line(
                canvas,
                Point::new(a.x + dx * at, a.y + dy * at),
                Point::new(a.x + dx * end, a.y + dy * end),
                color,
                thickness,
                imgproc::LINE_8,
                0,
            )?;
            at += 2 * DASH;
        }
    }
    Ok(())
}

impl Step for Annotate {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let image = input.image(0)?;
        let mut canvas = Mat::default();
        if image.channels() == 1 {
            imgproc::cvt_color_def(image, &mut canvas, imgproc::COLOR_GRAY2BGR)?;
        } else {
            image.copy_to(&mut canvas)?;
        }
        self.zones_and_lines(&mut canvas)?;
        for d in input
            .optional::<[crate::value::Detection]>(DETECTIONS)?
            .unwrap_or_default()
        {
            let r = rect(&d.bbox);
            imgproc::rectangle(
                &mut canvas,
                r,
                self.color,
                self.thickness,
                imgproc::LINE_8,
                0,
            )?;
            let text = format!("{} {:.2}", d.class, d.confidence);
            self.label(&mut canvas, &text, Point::new(r.x, r.y), self.color)?;
        }
        if let Some(tracks) = input.optional::<[Track]>(TRACKS)? {
            self.tracks(&mut canvas, tracks)?;
        }
        if let Some(counts) = input.optional::<Counts>(COUNTS)? {
            self.counts(&mut canvas, counts)?;
        }
        Ok(StepOutput::Values(vec![Value::Image(canvas.into())]))
    }
}

#[cfg(test)]
mod tests;
