//! The writer's output read back by GStreamer itself: real x264 and x265 packets in, `qtdemux`
//! (pushed bytes, as a browser's buffer gets them) and `avdec_h264` or `avdec_h265` out, every
//! picture decoded at the time written.

use std::time::Duration;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::*;
use crate::packets::track::Track;

/// One encoded access unit: its bytes, its times (from the first decoding time), and whether
/// it is a keyframe.
struct Unit {
    data: Vec<u8>,
    pts: Duration,
    dts: Duration,
    keyframe: bool,
}

/// `frames` frames of x264 at 25 fps (`bframes` B-frames between references), parsed as
/// `format` (`avc` or `byte-stream`): their caps and units.
fn encode(frames: u32, bframes: u32, format: &str) -> (gst::Caps, Vec<Unit>) {
    units(
        &format!(
            "x264enc speed-preset=ultrafast key-int-max=10 bframes={bframes} ! h264parse ! \
         video/x-h264,stream-format={format},alignment=au"
        ),
        frames,
    )
}

/// As [`encode`], with x265 (`format`: `hvc1`, `hev1` or `byte-stream`).
fn encode_h265(frames: u32, bframes: u32, format: &str) -> (gst::Caps, Vec<Unit>) {
    gst::init().unwrap();
    assert!(
        gst::ElementFactory::find("x265enc").is_some(),
        "no x265enc: install gstreamer1.0-plugins-bad (scripts/install-deps)"
    );
    units(
        &format!(
            "x265enc speed-preset=ultrafast key-int-max=10 option-string=bframes={bframes} ! \
         h265parse ! video/x-h265,stream-format={format},alignment=au"
        ),
        frames,
    )
}

/// The units of `frames` test pictures encoded and parsed by `encoder`, and their caps.
fn units(encoder: &str, frames: u32) -> (gst::Caps, Vec<Unit>) {
    gst::init().unwrap();
    let (pipeline, sink) = crate::frame::test_video::launch(&format!(
        "videotestsrc pattern=ball num-buffers={frames} ! \
         video/x-raw,format=I420,width=320,height=240,framerate=25/1 ! {encoder} ! \
         appsink name=sink sync=false"
    ));
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut caps = None;
    let mut units = Vec::new();
    // The encoders start their timestamps at 1000 h: taken from the first decoding time.
    let mut base = None;
    while let Ok(sample) = sink.pull_sample() {
        caps = sample.caps_owned();
        let buffer = sample.buffer().unwrap();
        let dts = buffer.dts().or(buffer.pts()).unwrap();
        let base = *base.get_or_insert(dts);
        units.push(Unit {
            data: buffer.map_readable().unwrap().to_vec(),
            pts: Duration::from(buffer.pts().unwrap() - base),
            dts: Duration::from(dts - base),
            keyframe: !buffer.flags().contains(gst::BufferFlags::DELTA_UNIT),
        });
    }
    pipeline.set_state(gst::State::Null).unwrap();
    assert_eq!(units.len(), frames as usize);
    (caps.unwrap(), units)
}

/// The init segment and a fragment per unit, as the endpoint writes them.
fn write(caps: &gst::Caps, units: &[Unit]) -> (Track, Vec<u8>) {
    let config = Track::of(caps, &units[0].data).unwrap().unwrap();
    let mut out = init_segment(&config);
    for (n, u) in units.iter().enumerate() {
        let sample = config.sample(&u.data);
        let decode = ticks(u.dts);
        out.extend(fragment(
            n as u32 + 1,
            &Sample {
                data: &sample,
                decode,
                offset: i32::try_from(ticks(u.pts) - decode).unwrap(),
                duration: TIMESCALE / 25,
                keyframe: u.keyframe,
            },
        ));
    }
    (config, out)
}

/// What GStreamer decodes of `bytes` pushed into `qtdemux`: each picture's presentation time.
fn decode(bytes: Vec<u8>) -> Vec<Duration> {
    decode_with(bytes, "h264")
}

/// As [`decode`], with `codec`'s parser and decoder (`h264`, `h265`).
fn decode_with(bytes: Vec<u8>, codec: &str) -> Vec<Duration> {
    let (pipeline, sink) = crate::frame::test_video::launch(&format!(
        "appsrc name=src caps=video/quicktime,variant=iso ! qtdemux ! {codec}parse ! \
         avdec_{codec} ! appsink name=sink sync=false",
    ));
    let src = pipeline
        .by_name("src")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    // In pieces of 4 kB, as a socket gives them.
    for piece in bytes.chunks(4096) {
        src.push_buffer(gst::Buffer::from_slice(piece.to_vec()))
            .unwrap();
    }
    src.end_of_stream().unwrap();
    let mut times = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        times.push(Duration::from(sample.buffer().unwrap().pts().unwrap()));
    }
    let bus = pipeline.bus().unwrap();
    let error = bus.pop_filtered(&[gst::MessageType::Error]);
    pipeline.set_state(gst::State::Null).unwrap();
    assert!(error.is_none(), "{error:?}");
    times
}

/// Presentation times as the file holds them: rounded to ticks, in presentation order.
fn written(units: &[Unit]) -> Vec<Duration> {
    let mut times: Vec<Duration> = units
        .iter()
        .map(|u| Duration::from_nanos(ticks(u.pts) * 1_000_000_000 / u64::from(TIMESCALE)))
        .collect();
    times.sort();
    times
}

/// Within a nanosecond of each other (a tick is not a whole number of nanoseconds).
fn same_times(got: &[Duration], want: &[Duration]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.abs_diff(*w) <= Duration::from_nanos(1))
}

#[test]
fn every_picture_of_a_length_prefixed_stream_decodes_at_the_time_written() {
    let (caps, units) = encode(30, 0, "avc");
    let (config, bytes) = write(&caps, &units);
    assert!(config.codec().starts_with("avc1."), "{}", config.codec());
    let times = decode(bytes);
    assert!(same_times(&times, &written(&units)), "{times:?}");
}

#[test]
fn b_frames_decode_in_presentation_order_at_their_own_times() {
    let (caps, units) = encode(30, 2, "avc");
    assert!(
        units.iter().any(|u| u.pts != u.dts),
        "x264 made no B-frames: the test proves nothing"
    );
    let (_, bytes) = write(&caps, &units);
    let times = decode(bytes);
    assert!(same_times(&times, &written(&units)), "{times:?}");
}

#[test]
fn a_byte_stream_is_written_length_prefixed_with_its_in_band_parameter_sets() {
    let (caps, units) = encode(20, 0, "byte-stream");
    let (config, bytes) = write(&caps, &units);
    let Track::Avc(config) = config else {
        panic!("not H.264: {config:?}")
    };
    assert_eq!(config.framing, crate::packets::avc::Framing::ByteStream);
    let times = decode(bytes);
    assert!(same_times(&times, &written(&units)), "{times:?}");
}

#[test]
fn every_picture_of_an_h265_stream_decodes_at_the_time_written_in_either_framing() {
    for format in ["byte-stream", "hvc1"] {
        let (caps, units) = encode_h265(20, 0, format);
        let (config, bytes) = write(&caps, &units);
        assert!(
            config.codec().starts_with("hvc1.1.6.L"),
            "{}",
            config.codec()
        );
        assert!(
            find(&bytes, b"hvc1") && find(&bytes, b"hvcC"),
            "{format}: no hvc1, hvcC"
        );
        let times = decode_with(bytes, "h265");
        assert!(same_times(&times, &written(&units)), "{format}: {times:?}");
    }
}

#[test]
fn h265_b_frames_decode_in_presentation_order_at_their_own_times() {
    let (caps, units) = encode_h265(20, 2, "byte-stream");
    assert!(
        units.iter().any(|u| u.pts != u.dts),
        "x265 made no B-frames: the test proves nothing"
    );
    let (_, bytes) = write(&caps, &units);
    let times = decode_with(bytes, "h265");
    assert!(same_times(&times, &written(&units)), "{times:?}");
}

/// Whether `bytes` hold a box of type `kind`.
fn find(bytes: &[u8], kind: &[u8; 4]) -> bool {
    bytes.windows(4).any(|w| w == kind)
}
