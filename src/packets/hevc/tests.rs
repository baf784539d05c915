//! The `hvcC` and codec string made here against x265's own stream as GStreamer's `h265parse`
//! describes it (its `codec_data` for `stream-format=hvc1`), and the parts that parse NAL units.

use gstreamer as gst;
use gstreamer::prelude::*;

use super::*;

/// x265 (main profile, no B-frames, a keyframe every 10) of `frames` frames, parsed by
/// `h265parse` both ways from the same encoder: the `hvc1` caps (with x265's record as
/// `codec_data`) and the byte stream's caps and first access unit.
fn x265(frames: u32) -> (gst::Caps, gst::Caps, Vec<u8>) {
    gst::init().unwrap();
    assert!(
        gst::ElementFactory::find("x265enc").is_some(),
        "no x265enc: install gstreamer1.0-plugins-bad (scripts/install-deps)"
    );
    let pipeline = gst::parse::launch(&format!(
        "videotestsrc pattern=ball num-buffers={frames} ! \
         video/x-raw,format=I420,width=320,height=240,framerate=25/1 ! \
         x265enc speed-preset=ultrafast key-int-max=10 option-string=bframes=0 ! tee name=t \
         t. ! queue ! h265parse ! video/x-h265,stream-format=hvc1,alignment=au ! \
         appsink name=hvc1 sync=false \
         t. ! queue ! h265parse ! video/x-h265,stream-format=byte-stream,alignment=au ! \
         appsink name=bytes sync=false"
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = |name| {
        pipeline
            .by_name(name)
            .unwrap()
            .downcast::<gstreamer_app::AppSink>()
            .unwrap()
    };
    let (hvc1, bytes) = (sink("hvc1"), sink("bytes"));
    pipeline.set_state(gst::State::Playing).unwrap();
    let first = bytes.pull_sample().unwrap();
    let parsed = hvc1.pull_sample().unwrap();
    let unit = first.buffer().unwrap().map_readable().unwrap().to_vec();
    let caps = (
        parsed.caps_owned().unwrap(),
        first.caps_owned().unwrap(),
        unit,
    );
    pipeline.set_state(gst::State::Null).unwrap();
    caps
}

#[test]
fn a_byte_stream_keyframe_makes_the_record_h265parse_makes_of_the_same_stream() {
    let (hvc1, byte_stream, keyframe) = x265(3);
    assert!(is_keyframe(&keyframe, Framing::ByteStream));
    let theirs = HevcConfig::of(&hvc1, &[]).unwrap().unwrap();
    let ours = HevcConfig::of(&byte_stream, &keyframe).unwrap().unwrap();
    assert_eq!(theirs.framing, Framing::Avc { length_size: 4 });
    assert_eq!(ours.framing, Framing::ByteStream);
    // The same record, but that `hvc1` asks every array be complete (GStreamer says not).
    assert_eq!(ours.record[..HEADER], theirs.record[..HEADER]);
    let (ours_arrays, theirs_arrays) = (arrays(&ours.record), arrays(&theirs.record));
    assert_eq!(
        ours_arrays.iter().map(|a| a.0 & 0x3f).collect::<Vec<_>>(),
        [NAL_VPS, NAL_SPS, NAL_PPS]
    );
    assert!(ours_arrays.iter().all(|a| a.0 & 0x80 != 0), "not complete");
    let without_completeness = |arrays: Vec<(u8, Vec<Vec<u8>>)>| {
        arrays
            .into_iter()
            .map(|(kind, nals)| (kind & 0x3f, nals))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        without_completeness(ours_arrays),
        without_completeness(theirs_arrays)
    );
    assert_eq!((ours.width, ours.height), (320, 240));
    // Main profile (1), compatible with Main and Main 10 (bits 1 and 2), main tier, level 2.1
    // (63: 320x240 at 25 fps); x265's constraint flags: progressive and frame only (0x90).
    assert_eq!(ours.codec(), "hvc1.1.6.L63.90");
    assert_eq!(theirs.codec(), "hvc1.1.6.L63.90");
}

/// A record's arrays: each its first byte (completeness and NAL type) and its NAL units.
fn arrays(record: &[u8]) -> Vec<(u8, Vec<Vec<u8>>)> {
    let mut at = HEADER;
    let mut out = Vec::new();
    for _ in 0..record[HEADER - 1] {
        let kind = record[at];
        let count = u16::from_be_bytes([record[at + 1], record[at + 2]]);
        at += 3;
        let mut nals = Vec::new();
        for _ in 0..count {
            let len = usize::from(u16::from_be_bytes([record[at], record[at + 1]]));
            nals.push(record[at + 2..at + 2 + len].to_vec());
            at += 2 + len;
        }
        out.push((kind, nals));
    }
    assert_eq!(at, record.len(), "bytes after the arrays");
    out
}

#[test]
fn the_codec_string_says_profile_space_tier_reversed_flags_and_trimmed_constraints() {
    let mut record = vec![1, 0x22, 0x20, 0, 0, 0, 0xb0, 0, 0, 0, 0, 0, 120];
    record.extend_from_slice(&[0xf0, 0, 0xfc, 0xfd, 0xfa, 0xfa, 0, 0, 0x0f, 0]);
    let mut config = HevcConfig {
        record,
        width: 3840,
        height: 2160,
        framing: Framing::ByteStream,
    };
    // Main 10 (2), high tier, compatible with Main 10 only (bit 2: 0x20000000 reversed is 4).
    assert_eq!(config.codec(), "hvc1.2.4.H120.B0");
    // Profile space 1 is `A`; no constraint flag: nothing after the level.
    config.record[1] = 0x41;
    config.record[2..6].copy_from_slice(&[0x60, 0, 0, 0]);
    config.record[6] = 0;
    config.record[12] = 93;
    assert_eq!(config.codec(), "hvc1.A1.6.L93");
    // A constraint byte after zero ones: the zeros before it are kept.
    config.record[9] = 0x01;
    assert_eq!(config.codec(), "hvc1.A1.6.L93.00.00.00.01");
}

#[test]
fn samples_are_length_prefixed_without_delimiters_and_keyframes_are_irap_pictures() {
    gst::init().unwrap();
    let aud = [0x46, 0x01, 0x50];
    let idr = [0x26, 0x01, 0xaf, 0x00, 0x00, 0x03, 0x01];
    let cra = [0x2a, 0x01, 0xac];
    let trail = [0x02, 0x01, 0xd0];
    let annex_b = |nals: &[&[u8]]| {
        let mut unit = Vec::new();
        for nal in nals {
            unit.extend_from_slice(&[0, 0, 0, 1]);
            unit.extend_from_slice(nal);
        }
        unit
    };
    let unit = annex_b(&[&aud, &idr]);
    assert!(is_keyframe(&unit, Framing::ByteStream));
    assert!(is_keyframe(&annex_b(&[&cra]), Framing::ByteStream));
    assert!(!is_keyframe(&annex_b(&[&aud, &trail]), Framing::ByteStream));
    let config = HevcConfig {
        record: vec![1; HEADER],
        width: 320,
        height: 240,
        framing: Framing::ByteStream,
    };
    let sample = config.sample(&unit);
    assert_eq!(
        nal_units(&sample, Framing::Avc { length_size: 4 }),
        vec![&idr[..]]
    );
    // Without parameter sets, a byte stream's unit makes no configuration; H.264 is no H.265.
    let caps = gst::Caps::builder("video/x-h265")
        .field("width", 320)
        .field("height", 240)
        .build();
    assert_eq!(HevcConfig::of(&caps, &unit), Ok(None));
    let h264 = gst::Caps::new_empty_simple("video/x-h264");
    assert_eq!(
        HevcConfig::of(&h264, &unit),
        Err(HevcError::NotH265("video/x-h264".to_owned()))
    );
}
