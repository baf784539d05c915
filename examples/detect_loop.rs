//! The baseline of `scripts/bench-demo`: the least a program can do to run a detector on a
//! video, with the same libraries as vidflow and nothing else. One thread runs the loop: pull a
//! decoded frame (GStreamer decodes and converts to BGR on its own streaming thread, as in
//! vidflow), `blobFromImage`, `forward`. No output decoding, no tracking, no drawing, no sink.
//!
//!   cargo run --release --example detect_loop -- CLIP CFG WEIGHTS INPUT_SIZE FRAMES
//!
//! Prints `frames SECONDS FPS`, timed from the first frame pulled (model loading and pipeline
//! start-up excluded) to the end of the last forward. OpenCV is held to one thread.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;
use opencv::core::{self, Mat, Scalar, Size, Vector};
use opencv::dnn;
use opencv::prelude::*;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [clip, cfg, weights, size, frames] = args.as_slice() else {
        bail!("usage: detect_loop CLIP CFG WEIGHTS INPUT_SIZE FRAMES");
    };
    let side: i32 = size.parse().context("input size")?;
    let frames: usize = frames.parse().context("frames")?;
    core::set_num_threads(1)?;
    let mut net = dnn::read_net_from_darknet(cfg, weights)?;
    let names: Vector<String> = net.get_unconnected_out_layers_names()?;

    gst::init()?;
    let pipeline = gst::parse::launch(
        "filesrc name=src ! decodebin ! videoconvert ! video/x-raw,format=BGR ! \
         appsink name=sink sync=false max-buffers=4",
    )?
    .downcast::<gst::Pipeline>()
    .map_err(|_| anyhow::anyhow!("not a pipeline"))?;
    pipeline
        .by_name("src")
        .context("filesrc")?
        .set_property("location", clip);
    let sink = pipeline
        .by_name("sink")
        .context("appsink")?
        .downcast::<gst_app::AppSink>()
        .map_err(|_| anyhow::anyhow!("not an appsink"))?;
    pipeline.set_state(gst::State::Playing)?;

    let mut start = None;
    let mut done = 0;
    let mut outputs = Vector::<Mat>::new();
    while done < frames {
        let Ok(sample) = sink.pull_sample() else {
            break;
        };
        start.get_or_insert_with(Instant::now);
        let caps = sample.caps().context("caps")?;
        let info = gst_video::VideoInfo::from_caps(caps)?;
        let buffer = sample.buffer().context("buffer")?;
        let map = buffer.map_readable()?;
        let (rows, cols, stride) = (info.height() as i32, info.width() as i32, info.stride()[0]);
        if map.len() < rows as usize * stride as usize {
            bail!("short buffer");
        }
        // SAFETY: the mapping holds `rows` rows of `stride` bytes (checked above), each with
        // `cols` BGR pixels; `map` outlives `image`, which is only read (by blobFromImage).
        let image = unsafe {
            Mat::new_rows_cols_with_data_unsafe(
                rows,
                cols,
                core::CV_8UC3,
                map.as_ptr().cast_mut().cast(),
                stride as usize,
            )
        }?;
        let blob = dnn::blob_from_image(
            &image,
            1.0 / 255.0,
            Size::new(side, side),
            Scalar::default(),
            true,
            false,
            core::CV_32F,
        )?;
        net.set_input_def(&blob)?;
        net.forward(&mut outputs, &names)?;
        done += 1;
    }
    pipeline.set_state(gst::State::Null)?;
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    println!("{done} {seconds:.3} {:.2}", done as f64 / seconds);
    Ok(())
}
