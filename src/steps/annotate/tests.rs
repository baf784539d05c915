use std::sync::Arc;

use opencv::core::{CV_8UC3, Vec3b};

use super::*;
use crate::frame::Frame;
use crate::frame::test_video::decoded;
use crate::value::{Detection, Image};

const BLACK: [u8; 3] = [0, 0, 0];

fn frame() -> Arc<Frame> {
    let (buffer, info) = decoded("video/x-raw,format=NV12,width=320,height=240");
    Arc::new(Frame::from_buffer("cam".into(), 0, buffer, &info).unwrap())
}

fn black() -> Value {
    let mat = Mat::new_rows_cols_with_default(240, 320, CV_8UC3, Scalar::all(0.0)).unwrap();
    Value::Image(Image::from(mat))
}

fn plain() -> Annotate {
    Annotate {
        color: Scalar::new(0.0, 255.0, 0.0, 0.0),
        thickness: 1,
        zones: Vec::new(),
        lines: Vec::new(),
    }
}

/// Runs the step on a black image with these optional inputs; the drawn image.
fn draw(
    step: &Annotate,
    detections: Option<Value>,
    tracks: Option<Value>,
    counts: Option<Value>,
) -> Mat {
    let frame = frame();
    let values = [Some(black()), detections, tracks, counts];
    let out = step
        .run(&StepInput {
            frame: &frame,
            values: &values,
        })
        .unwrap();
    let StepOutput::Values(out) = out else {
        panic!("no output")
    };
    out[0]
        .get::<Image>()
        .unwrap()
        .mat()
        .unwrap()
        .try_clone()
        .unwrap()
}

fn pixel(image: &Mat, x: i32, y: i32) -> [u8; 3] {
    image.at_2d::<Vec3b>(y, x).unwrap().0
}

fn bgr(c: Scalar) -> [u8; 3] {
    [c[0] as u8, c[1] as u8, c[2] as u8]
}

fn nonzero(image: &Mat) -> i32 {
    let mut grey = Mat::default();
    imgproc::cvt_color_def(image, &mut grey, imgproc::COLOR_BGR2GRAY).unwrap();
    opencv::core::count_non_zero(&grey).unwrap()
}

fn bbox(x: f32, y: f32, width: f32, height: f32) -> BBox {
    BBox {
        x,
        y,
        width,
        height,
    }
}

fn track(id: u64, b: BBox, predicted: bool) -> Track {
    Track {
        track_id: id,
        detection: Detection::new("person".into(), 0.9, b),
        predicted,
        ground: None,
        speed: None,
        dwell: None,
    }
}

#[test]
fn a_track_is_boxed_in_its_own_colour_and_a_predicted_one_dashed() {
    let tracks = Value::Tracks(Arc::from(vec![
        track(7, bbox(100.0, 100.0, 40.0, 60.0), false),
        track(8, bbox(200.0, 100.0, 40.0, 60.0), true),
    ]));
    let image = draw(&plain(), None, Some(tracks), None);
    let (seven, eight) = (bgr(track_color(7)), bgr(track_color(8)));
    assert_ne!(seven, eight);
    // The seen track: its whole left edge, in its colour; inside and outside untouched.
    for y in 100..160 {
        assert_eq!(pixel(&image, 100, y), seven, "left edge at y={y}");
    }
    assert_eq!(pixel(&image, 120, 130), BLACK);
    assert_eq!(pixel(&image, 60, 130), BLACK);
    // The predicted one: dashes on its top edge (from its left corner), gaps between them.
    assert_eq!(pixel(&image, 203, 100), eight);
    assert_eq!(pixel(&image, 209, 100), BLACK, "a gap of the dashed box");
    assert_eq!(pixel(&image, 215, 100), eight);
    // Its label ("person #7") is above the box.
    let above = Mat::roi(&image, Rect::new(100, 84, 60, 14)).unwrap();
    assert!(
        nonzero(&above.try_clone().unwrap()) > 20,
        "no label above the box"
    );
    // The same ID has the same colour in every run.
    assert_eq!(track_color(7), track_color(7));
}

#[test]
fn nothing_is_drawn_for_an_optional_input_absent_on_a_frame() {
    let image = draw(&plain(), None, None, None);
    assert_eq!(nonzero(&image), 0);
    // Empty values draw nothing either.
    let image = draw(
        &plain(),
        Some(Value::Detections(Arc::from(Vec::new()))),
        Some(Value::Tracks(Arc::from(Vec::new()))),
        None,
    );
    assert_eq!(nonzero(&image), 0);
}

#[test]
fn detections_zones_and_lines_are_drawn_where_given() {
    let mut step = plain();
    step.zones = vec![(
        "door".to_owned(),
        vec![
            Point::new(20, 150),
            Point::new(80, 150),
            Point::new(80, 200),
        ],
    )];
    step.lines = vec![[Point::new(10, 220), Point::new(310, 220)]];
    let detections = Value::Detections(Arc::from(vec![Detection::new(
        "car".into(),
        0.5,
        bbox(150.0, 30.0, 50.0, 40.0),
    )]));
    let image = draw(&step, Some(detections), None, None);
    let green = bgr(step.color);
    assert_eq!(pixel(&image, 50, 150), green, "zone edge");
    assert_eq!(pixel(&image, 80, 175), green, "zone edge");
    assert_eq!(pixel(&image, 160, 220), green, "line");
    assert_eq!(pixel(&image, 160, 225), BLACK, "below the line");
    assert_eq!(pixel(&image, 175, 30), green, "detection's top edge");
    assert_eq!(pixel(&image, 175, 50), BLACK, "inside the detection");
}

#[test]
fn counts_are_a_panel_in_the_top_left_corner() {
    let counts: Counts = Counts([("in".into(), 3), ("out".into(), 5)].into_iter().collect());
    let image = draw(&plain(), None, None, Some(Value::Counts(Arc::new(counts))));
    let corner = Mat::roi(&image, Rect::new(0, 0, 160, 40))
        .unwrap()
        .try_clone()
        .unwrap();
    let rest = Mat::roi(&image, Rect::new(0, 60, 320, 180))
        .unwrap()
        .try_clone()
        .unwrap();
    assert!(nonzero(&corner) > 50, "no text in the corner");
    assert_eq!(nonzero(&rest), 0);
    // White text.
    let mut max = 0.0;
    opencv::core::min_max_loc(
        &corner.reshape(1, 0).unwrap(),
        None,
        Some(&mut max),
        None,
        None,
        &opencv::core::no_array(),
    )
    .unwrap();
    assert_eq!(max, 255.0);
}

#[test]
fn a_track_label_shows_its_speed_and_time_in_zones_when_it_has_them() {
    let still = track(3, bbox(100.0, 100.0, 40.0, 60.0), false);
    assert_eq!(track_label(&still), "person #3");
    let walking = Track {
        speed: Some(Speed::Kmh(5.14)),
        dwell: Some(Arc::new([("door".into(), 12.4)].into_iter().collect())),
        ..still.clone()
    };
    assert_eq!(track_label(&walking), "person #3 5.1 km/h door 12 s");
    let uncalibrated = Track {
        speed: Some(Speed::PxPerS(41.6)),
        ..still.clone()
    };
    assert_eq!(track_label(&uncalibrated), "person #3 42 px/s");
    // Drawn: the longer label reaches further right than the plain one.
    let reach = |t: Track| {
        let image = draw(
            &plain(),
            None,
            Some(Value::Tracks(Arc::from(vec![t]))),
            None,
        );
        let right = Mat::roi(&image, Rect::new(180, 80, 140, 18)).unwrap();
        nonzero(&right.try_clone().unwrap())
    };
    assert_eq!(reach(still), 0);
    assert!(reach(walking) > 20, "no speed drawn beside the label");
}
