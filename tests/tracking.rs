//! Tracking on a clip made at test time (`common::shapes`): plain shapes on known paths, real
//! H.264, decoded by the real `vidflow` binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::shapes::Scene;
use common::*;
use gstreamer as gst;
use gstreamer::prelude::*;
use opencv::core::{Mat, MatTraitConst};

/// A decoded pixel this far from the drawn one (in levels of 255, any channel) is wrong: the
/// I420 round trip moves flat colours by 2 or 3 levels, more only where chroma is shared by
/// a shape's edge and its surroundings.
const WRONG_LEVELS: u8 = 40;

/// Every frame of `path` decoded to BGR.
fn decode_bgr(path: &std::path::Path) -> Vec<Vec<u8>> {
    gst_init();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! decodebin ! videoconvert ! video/x-raw,format=BGR ! \
         appsink name=out sync=false",
        path.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = pipeline
        .by_name("out")
        .unwrap()
        .downcast::<gstreamer_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut frames = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        let info = gstreamer_video::VideoInfo::from_caps(sample.caps().unwrap()).unwrap();
        let map = sample.buffer().unwrap().map_readable().unwrap();
        let row = info.width() as usize * 3;
        let stride = info.stride()[0] as usize;
        frames.push(
            map.chunks(stride)
                .take(info.height() as usize)
                .flat_map(|r| r[..row].iter().copied())
                .collect(),
        );
    }
    pipeline.set_state(gst::State::Null).unwrap();
    frames
}

/// Pixels of `decoded` (BGR) with a channel more than [`WRONG_LEVELS`] away from `drawn`'s,
/// away from edges: chroma is shared by 2x2 pixels in I420 and blurred when upsampled, so only
/// pixels whose 5x5 neighbourhood is one colour in the drawing are compared.
fn wrong_pixels(decoded: &[u8], drawn: &Mat) -> usize {
    use opencv::core::{self as cv, MatExprTraitConst, Point, Scalar};
    use opencv::imgproc;
    let decoded = Mat::new_rows_cols_with_data(drawn.rows(), drawn.cols() * 3, decoded).unwrap();
    let decoded = decoded.reshape(3, drawn.rows()).unwrap();
    // Flat: the 5x5 minimum and maximum of every channel agree.
    let kernel = Mat::ones(5, 5, cv::CV_8U).unwrap().to_mat().unwrap();
    let (mut low, mut high) = (Mat::default(), Mat::default());
    let anchor = Point::new(-1, -1);
    let border = imgproc::morphology_default_border_value().unwrap();
    imgproc::erode(
        drawn,
        &mut low,
        &kernel,
        anchor,
        1,
        cv::BORDER_REPLICATE,
        border,
    )
    .unwrap();
    imgproc::dilate(
        drawn,
        &mut high,
        &kernel,
        anchor,
        1,
        cv::BORDER_REPLICATE,
        border,
    )
    .unwrap();
    let mut spread = Mat::default();
    cv::absdiff(&high, &low, &mut spread).unwrap();
    let mut diff = Mat::default();
    cv::absdiff(&decoded, drawn, &mut diff).unwrap();
    let (mut spread_max, mut diff_max) = (Mat::default(), Mat::default());
    max_channel(&spread, &mut spread_max);
    max_channel(&diff, &mut diff_max);
    let mut flat = Mat::default();
    cv::compare(&spread_max, &Scalar::all(0.0), &mut flat, cv::CMP_EQ).unwrap();
    let mut far = Mat::default();
    cv::compare(
        &diff_max,
        &Scalar::all(f64::from(WRONG_LEVELS)),
        &mut far,
        cv::CMP_GT,
    )
    .unwrap();
    let mut both = Mat::default();
    cv::bitwise_and(&flat, &far, &mut both, &cv::no_array()).unwrap();
    cv::count_non_zero(&both).unwrap() as usize
}

/// The largest of the three channels of each pixel.
fn max_channel(bgr: &Mat, out: &mut Mat) {
    let mut planes = opencv::core::Vector::<Mat>::new();
    opencv::core::split(bgr, &mut planes).unwrap();
    let mut m = Mat::default();
    opencv::core::max(&planes.get(0).unwrap(), &planes.get(1).unwrap(), &mut m).unwrap();
    opencv::core::max(&m, &planes.get(2).unwrap(), out).unwrap();
}

#[test]
fn the_synthetic_clip_is_real_video_of_the_drawn_frames_with_known_boxes() {
    let scene = Scene::standard();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shapes.mp4");
    scene.write_mp4(&path);
    let decoded = decode_bgr(&path);
    assert_eq!(decoded.len(), scene.frames as usize);
    for (f, pixels) in decoded.iter().enumerate() {
        let drawn = scene.render(f as u32);
        assert_eq!(drawn.cols(), scene.width);
        let wrong = wrong_pixels(pixels, &drawn);
        assert_eq!(
            wrong, 0,
            "frame {f}: {wrong} pixels differ from the drawing"
        );
    }
    // The ground truth the tracking tests rely on.
    let east = scene.mover("east");
    let west = scene.mover("west");
    let stops = scene.mover("stops");
    let in_frame = |b: &vidflow::value::BBox| b.x >= 0.0 && b.x + b.width <= 320.0;
    let hidden: Vec<u32> = scene
        .frames_where(east, in_frame)
        .into_iter()
        .filter(|&f| scene.visible(east, f).is_none())
        .collect();
    assert_eq!(hidden, (42..=45).collect::<Vec<_>>());
    // Wholly in view and not occluded, what is seen is the whole box (the ellipse too).
    for i in [east, west, stops] {
        let f = scene.frames_where(i, |b| b.x > 20.0 && b.x < 100.0)[0];
        assert_eq!(
            scene.visible(i, f),
            scene.bbox(i, f),
            "{}",
            scene.movers[i].name
        );
    }
    let east_mid = scene.crosses_x(east, 160.0).unwrap();
    let west_mid = scene.crosses_x(west, 160.0).unwrap();
    assert!(east_mid.abs_diff(west_mid) <= 2, "{east_mid} {west_mid}");
    assert_eq!(scene.bbox(stops, 40), scene.bbox(stops, 79));
    assert_eq!(scene.bbox(stops, 4), None);
}
