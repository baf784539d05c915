//! A synthetic clip made at test time: plain shapes moving along known straight paths over a
//! still background, so a test knows where every object is on every frame (the ground truth of
//! tracking, zone and line tests).
//!
//! A [`Scene`] is a list of [`Mover`]s (each a rectangle or an ellipse of one colour whose
//! top-left corner goes in straight lines between keyframes, drawn only from its first keyframe
//! to its last) and still [`Occluder`]s drawn on top of them. Frames are drawn with OpenCV and
//! encoded through a real GStreamer pipeline (`appsrc ! videoconvert ! I420 ! x264enc ! mp4mux !
//! filesink`): the video a test reads is real encoded H.264, decoded by vidflow like any file.
//!
//! Boxes are integer pixels, exactly what is drawn: [`Scene::bbox`] is where a mover is (hidden
//! or not), [`Scene::visible`] the box of the pixels of it that can be seen on the frame. Frame
//! numbers are the `frame` of vidflow's JSON lines.
//!
//! [`Scene::standard`] is the clip the tracking tests use; build your own `Scene` for others.

use std::path::Path;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use opencv::core::{CV_8UC1, CV_8UC3, Mat, MatTraitConst, MatTraitConstManual, Point, Rect};
use opencv::core::{Scalar, Size, Vector};
use opencv::imgproc;
use vidflow::value::BBox;

use super::gst_init;

/// How a mover is drawn: filled, inside its box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Rect,
    Ellipse,
}

/// One shape moving along a path.
#[derive(Debug, Clone)]
pub struct Mover {
    pub name: &'static str,
    pub form: Form,
    /// Blue, green, red.
    pub colour: [u8; 3],
    pub width: i32,
    pub height: i32,
    /// `(frame, x, y)` of the box's top-left corner, frames increasing. Straight lines between
    /// keyframes; the mover exists (is drawn) from the first keyframe's frame to the last's.
    /// Repeat a position at two frames to make it stand still.
    pub path: Vec<(u32, f32, f32)>,
}

/// A still rectangle drawn over the movers.
#[derive(Debug, Clone, Copy)]
pub struct Occluder {
    pub x: i32,
    pub y: i32,
    pub width: i32,
    pub height: i32,
    pub colour: [u8; 3],
}

/// A clip: its size and rate, background, movers and occluders.
#[derive(Debug, Clone)]
pub struct Scene {
    pub width: i32,
    pub height: i32,
    pub fps: i32,
    pub frames: u32,
    pub background: [u8; 3],
    pub movers: Vec<Mover>,
    pub occluders: Vec<Occluder>,
}

impl Mover {
    /// The top-left corner at `frame` (rounded to the pixel drawn), or `None` outside the path.
    pub fn position(&self, frame: u32) -> Option<(i32, i32)> {
        let first = self.path.first()?;
        let last = self.path.last()?;
        if frame < first.0 || frame > last.0 {
            return None;
        }
        let (x, y) = self
            .path
            .windows(2)
            .find(|w| frame >= w[0].0 && frame <= w[1].0)
            .map(|w| {
                let (f0, x0, y0) = w[0];
                let (f1, x1, y1) = w[1];
                let t = if f1 > f0 {
                    (frame - f0) as f32 / (f1 - f0) as f32
                } else {
                    0.0
                };
                (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
            })
            .unwrap_or((first.1, first.2));
        Some((x.round() as i32, y.round() as i32))
    }
}

impl Scene {
    /// The tracking tests' clip: 320x240, 10 fps, 80 frames, grey background.
    /// - `east`: red square 36x36 in the top lane (y 30..66), enters at the left edge at frame 0
    ///   and leaves at the right edge at frame 79 (4.5 px a frame); passes behind `pillar`
    ///   (x 150..206): wholly hidden while its x is in 150..=170 (frames 42 to 45).
    /// - `west`: green circle 36x36 in the middle lane (y 110..146), enters at the right edge at
    ///   frame 0 and leaves at the left at frame 79: the opposite way, passing `east`'s x around
    ///   frame 40 (their lanes never overlap).
    /// - `stops`: blue square 32x32 in the bottom lane (y 180..212), enters at the left edge at
    ///   frame 5, moves right to x = 140 at frame 40, then stands still to the end.
    ///
    /// One occluder, `pillar`: x 150..206, y 10..80, dark, over the top lane only.
    pub fn standard() -> Self {
        Self {
            width: 320,
            height: 240,
            fps: 10,
            frames: 80,
            background: [96, 96, 96],
            movers: vec![
                Mover {
                    name: "east",
                    form: Form::Rect,
                    colour: [40, 40, 220],
                    width: 36,
                    height: 36,
                    path: vec![(0, -36.0, 30.0), (79, 320.0, 30.0)],
                },
                Mover {
                    name: "west",
                    form: Form::Ellipse,
                    colour: [40, 200, 40],
                    width: 36,
                    height: 36,
                    path: vec![(0, 320.0, 110.0), (79, -36.0, 110.0)],
                },
                Mover {
                    name: "stops",
                    form: Form::Rect,
                    colour: [220, 120, 30],
                    width: 32,
                    height: 32,
                    path: vec![(5, -32.0, 180.0), (40, 140.0, 180.0), (79, 140.0, 180.0)],
                },
            ],
            occluders: vec![Occluder {
                x: 150,
                y: 10,
                width: 56,
                height: 70,
                colour: [30, 30, 30],
            }],
        }
    }

    /// The mover named `name` (panics when there is none: a typo in a test).
    pub fn mover(&self, name: &str) -> usize {
        self.movers
            .iter()
            .position(|m| m.name == name)
            .unwrap_or_else(|| panic!("no mover named {name:?}"))
    }

    /// Where mover `i` is at `frame`, whole, whether it can be seen or not (it may stick out of
    /// the frame or be behind an occluder); `None` when it is not in the scene at that frame.
    pub fn bbox(&self, i: usize, frame: u32) -> Option<BBox> {
        let m = &self.movers[i];
        let (x, y) = m.position(frame)?;
        Some(BBox {
            x: x as f32,
            y: y as f32,
            width: m.width as f32,
            height: m.height as f32,
        })
    }

    /// The box of the pixels of mover `i` that can be seen at `frame` (inside the frame, not
    /// covered by an occluder); `None` when none can be.
    pub fn visible(&self, i: usize, frame: u32) -> Option<BBox> {
        let mut mask =
            Mat::new_rows_cols_with_default(self.height, self.width, CV_8UC1, Scalar::all(0.0))
                .unwrap();
        self.draw_mover(&mut mask, i, frame, Scalar::all(255.0));
        for o in &self.occluders {
            fill_rect(&mut mask, o.rect(), Scalar::all(0.0));
        }
        let mut points = Vector::<Point>::new();
        opencv::core::find_non_zero(&mask, &mut points).unwrap();
        if points.is_empty() {
            return None;
        }
        Some(BBox::from(imgproc::bounding_rect(&points).unwrap()))
    }

    /// The frames at which mover `i` exists and `test` holds of its whole box.
    pub fn frames_where(&self, i: usize, test: impl Fn(&BBox) -> bool) -> Vec<u32> {
        (0..self.frames)
            .filter(|&f| self.bbox(i, f).is_some_and(|b| test(&b)))
            .collect()
    }

    /// The first frame at which the centre of mover `i`'s box has gone past `x` (from either
    /// side): the frame a vertical line at `x` is crossed.
    pub fn crosses_x(&self, i: usize, x: f32) -> Option<u32> {
        let centre = |f| self.bbox(i, f).map(|b| b.x + b.width / 2.0);
        let start = centre(self.movers[i].path.first()?.0)?;
        (0..self.frames).find(|&f| centre(f).is_some_and(|c| (c - x) * (start - x) < 0.0))
    }

    /// Frame `frame` as BGR pixels.
    pub fn render(&self, frame: u32) -> Mat {
        let [b, g, r] = self.background;
        let mut image = Mat::new_rows_cols_with_default(
            self.height,
            self.width,
            CV_8UC3,
            Scalar::new(b as f64, g as f64, r as f64, 0.0),
        )
        .unwrap();
        for i in 0..self.movers.len() {
            let [b, g, r] = self.movers[i].colour;
            let colour = Scalar::new(b as f64, g as f64, r as f64, 0.0);
            self.draw_mover(&mut image, i, frame, colour);
        }
        for o in &self.occluders {
            let [b, g, r] = o.colour;
            fill_rect(
                &mut image,
                o.rect(),
                Scalar::new(b as f64, g as f64, r as f64, 0.0),
            );
        }
        image
    }

    fn draw_mover(&self, image: &mut Mat, i: usize, frame: u32, colour: Scalar) {
        let m = &self.movers[i];
        let Some((x, y)) = m.position(frame) else {
            return;
        };
        let rect = Rect::new(x, y, m.width, m.height);
        match m.form {
            Form::Rect => fill_rect(image, rect, colour),
            Form::Ellipse => {
                // Drawn in 1/16 pixel so that the ellipse fills exactly its box.
                const SHIFT: i32 = 4;
                let s = 1 << SHIFT;
                let centre = Point::new(
                    (2 * x + m.width - 1) * s / 2,
                    (2 * y + m.height - 1) * s / 2,
                );
                let axes = Size::new((m.width - 1) * s / 2, (m.height - 1) * s / 2);
                imgproc::ellipse(
                    image,
                    centre,
                    axes,
                    0.0,
                    0.0,
                    360.0,
                    colour,
                    imgproc::FILLED,
                    imgproc::LINE_8,
                    SHIFT,
                )
                .unwrap();
            }
        }
    }

    /// Encodes the clip as H.264 (I420) in MP4 at `path`, through a real GStreamer pipeline.
    pub fn write_mp4(&self, path: &Path) {
        gst_init();
        let pipeline = gst::parse::launch(&format!(
            "appsrc name=src format=time ! videoconvert ! video/x-raw,format=I420 ! \
             x264enc speed-preset=ultrafast pass=quant quantizer=12 ! h264parse ! mp4mux ! \
             filesink location={}",
            path.display()
        ))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        let src = pipeline
            .by_name("src")
            .unwrap()
            .downcast::<gst_app::AppSrc>()
            .unwrap();
        let caps = gst::Caps::builder("video/x-raw")
            .field("format", "BGR")
            .field("width", self.width)
            .field("height", self.height)
            .field("framerate", gst::Fraction::new(self.fps, 1))
            .build();
        src.set_caps(Some(&caps));
        pipeline.set_state(gst::State::Playing).unwrap();
        let period = gst::ClockTime::SECOND / self.fps as u64;
        for frame in 0..self.frames {
            let image = self.render(frame);
            // GStreamer's BGR rows start on 4-byte boundaries.
            let row = self.width as usize * 3;
            let stride = row.next_multiple_of(4);
            let mut bytes = vec![0; stride * self.height as usize];
            for (out, pixels) in bytes
                .chunks_mut(stride)
                .zip(image.data_bytes().unwrap().chunks(row))
            {
                out[..row].copy_from_slice(pixels);
            }
            let mut buffer = gst::Buffer::from_mut_slice(bytes);
            {
                let b = buffer.get_mut().unwrap();
                b.set_pts(period * frame as u64);
                b.set_duration(period);
            }
            src.push_buffer(buffer).unwrap();
        }
        src.end_of_stream().unwrap();
        let bus = pipeline.bus().unwrap();
        let msg = bus
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(120),
                &[gst::MessageType::Eos, gst::MessageType::Error],
            )
            .expect("encoding the clip did not finish");
        pipeline.set_state(gst::State::Null).unwrap();
        if let gst::MessageView::Error(e) = msg.view() {
            panic!(
                "encoding {}: {} ({:?})",
                path.display(),
                e.error(),
                e.debug()
            );
        }
    }
}

impl Occluder {
    fn rect(&self) -> Rect {
        Rect::new(self.x, self.y, self.width, self.height)
    }
}

fn fill_rect(image: &mut Mat, rect: Rect, colour: Scalar) {
    imgproc::rectangle(image, rect, colour, imgproc::FILLED, imgproc::LINE_8, 0).unwrap();
}
