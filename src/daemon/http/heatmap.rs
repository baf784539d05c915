//! `GET /api/counts/zones` (each zone's visits, dwell, loitering, speeding and occupancy per
//! bucket, `events::zones`) and `GET /api/heatmap` (where objects stood, as JSON, or with
//! `format=png` as a colour map blended over the camera's latest still).
//!
//! The still is the preview sink's newest JPEG of the source (`sinks::preview::hub`): when none
//! was encoded yet (nobody watched), the API thread holds a watch for at most [`STILL_WAIT`],
//! so that the sink encodes one; a source without a preview sink, or none in that time, gets
//! the map over black, at the size of the frames it was made from.

use std::time::Duration;

use opencv::core::{self, Mat, Scalar, Vector};
use opencv::prelude::*;
use opencv::{imgcodecs, imgproc};
use serde_json::json;

use super::answer::{self as api, Answer, Call};
use crate::events::query::QueryError;
use crate::events::zones::{self, HeatFilter, Heatmap, ZoneFilter};
use crate::sinks::preview::hub;

/// Longest an API thread waits for a preview sink's first JPEG of a source (it encodes one at
/// its `max_fps` once watched: 5 a second by default).
const STILL_WAIT: Duration = Duration::from_millis(1500);
/// The size of a map made from no rows, over no still.
const BLANK: (i32, i32) = (640, 480);
/// How much of the colour shows over the still where someone stood.
const ALPHA: f64 = 0.55;

pub(super) fn zones(c: &Call<'_>) -> Answer {
    let db = match api::store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    match ZoneFilter::from_pairs(&c.pairs)
        .map_err(QueryError::from)
        .and_then(|f| zones::zones(&db, &f))
    {
        Ok(rows) => api::json_answer(200, &json!({ "zones": rows })),
        Err(e) => api::failed(&e),
    }
}

pub(super) fn heatmap(c: &Call<'_>) -> Answer {
    let db = match api::store(c) {
        Ok(db) => db,
        Err(answer) => return answer,
    };
    let f = match HeatFilter::from_pairs(&c.pairs) {
        Ok(f) => f,
        Err(e) => return api::failed(&e.into()),
    };
    let map = match zones::heatmap(&db, &f) {
        Ok(map) => map,
        Err(e) => return api::failed(&e),
    };
    if !f.png {
        return api::json_answer(200, &json!(map));
    }
    // The still of the source named, or of the only one.
    let source = f
        .source
        .clone()
        .or_else(|| match c.parts.sources.as_slice() {
            [only] => Some(only.name.to_string()),
            _ => None,
        });
    let still = source
        .filter(|s| super::preview::available(c.parts, s))
        .and_then(|s| hub().channel(&s).watch().next(STILL_WAIT));
    match picture(&map, still.as_deref()) {
        Ok(png) => Answer::Bytes(super::response(200, "image/png", &png, "")),
        Err(e) => api::text(500, &format!("cannot draw the heatmap: {e}")),
    }
}

/// The map as a PNG: its cells' seconds (square root, so that a short visit still shows) as
/// OpenCV's JET colours, blended over `still` (a JPEG) where anyone stood, at the still's size.
fn picture(map: &Heatmap, still: Option<&[u8]>) -> opencv::Result<Vec<u8>> {
    let mut base = match still {
        Some(jpeg) => imgcodecs::imdecode(&Mat::from_slice(jpeg)?, imgcodecs::IMREAD_COLOR)?,
        None => Mat::default(),
    };
    if base.empty() {
        let (w, h) = if map.width > 0 && map.height > 0 {
            (map.width, map.height)
        } else {
            BLANK
        };
        base = Mat::new_rows_cols_with_default(h, w, core::CV_8UC3, Scalar::all(0.0))?;
    }
    let most = map.seconds.iter().copied().fold(0.0_f32, f32::max);
    let mut grid = Mat::new_rows_cols_with_default(
        map.rows as i32,
        map.cols as i32,
        core::CV_8UC1,
        Scalar::all(0.0),
    )?;
    if most > 0.0 {
        for (i, &s) in map.seconds.iter().enumerate() {
            let v = (255.0 * (s / most).sqrt()).round().clamp(0.0, 255.0) as u8;
            *grid.at_2d_mut::<u8>((i / map.cols) as i32, (i % map.cols) as i32)? = v;
        }
    }
    let mut up = Mat::default();
    imgproc::resize(
        &grid,
        &mut up,
        base.size()?,
        0.0,
        0.0,
        imgproc::INTER_LINEAR,
    )?;
    let mut colour = Mat::default();
    imgproc::apply_color_map(&up, &mut colour, imgproc::COLORMAP_JET)?;
    let mut blended = Mat::default();
    core::add_weighted(&base, 1.0 - ALPHA, &colour, ALPHA, 0.0, &mut blended, -1)?;
    let mut mask = Mat::default();
    imgproc::threshold(&up, &mut mask, 0.0, 255.0, imgproc::THRESH_BINARY)?;
    blended.copy_to_masked(&mut base, &mask)?;
    let mut png = Vector::<u8>::new();
    imgcodecs::imencode(".png", &base, &mut png, &Vector::new())?;
    Ok(png.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_over_no_still_is_drawn_at_its_frames_size_and_colours_only_where_someone_stood() {
        let mut map = Heatmap {
            cols: 32,
            rows: 24,
            width: 320,
            height: 240,
            total_s: 2.0,
            seconds: vec![0.0; 32 * 24],
        };
        map.seconds[0] = 2.0;
        let png = picture(&map, None).unwrap();
        let img =
            imgcodecs::imdecode(&Mat::from_slice(&png).unwrap(), imgcodecs::IMREAD_COLOR).unwrap();
        assert_eq!((img.cols(), img.rows()), (320, 240));
        let at = |x, y| *img.at_2d::<core::Vec3b>(y, x).unwrap();
        assert_ne!(at(2, 2), core::Vec3b::all(0), "the busy cell is coloured");
        assert_eq!(
            at(300, 200),
            core::Vec3b::all(0),
            "elsewhere the still (black)"
        );
    }
}
