//! Reading vidflow's live video (`/api/video/SOURCE`, fragmented MP4) in tests: a small box
//! reader that keeps every byte, each fragment's times and keyframe flag, and GStreamer's own
//! decoder on the bytes (`qtdemux ! h264parse ! avdec_h264`, or H.265's) for the pictures it
//! decodes. Nothing is mocked. Used by `tests/video.rs`.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::io::Read;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

/// Ticks per second of the stream's times.
pub const TIMESCALE: u64 = 90_000;

/// One fragment of the stream: its times (ticks), whether it is a keyframe.
#[derive(Debug, Clone, Copy)]
pub struct Fragment {
    pub decode: u64,
    pub offset: i64,
    pub keyframe: bool,
}

impl Fragment {
    pub fn presentation(&self) -> u64 {
        (self.decode as i64 + self.offset) as u64
    }
}

/// Reads fragmented MP4 box by box, keeping every byte for a decoder.
pub struct Mp4<R> {
    pub reader: R,
    pub bytes: Vec<u8>,
}

impl<R: Read> Mp4<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            bytes: Vec::new(),
        }
    }

    /// The next box: its type and body.
    pub fn next_box(&mut self) -> ([u8; 4], Vec<u8>) {
        let mut head = [0u8; 8];
        self.reader.read_exact(&mut head).unwrap();
        let size = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
        let mut body = vec![0; size - 8];
        self.reader.read_exact(&mut body).unwrap();
        self.bytes.extend_from_slice(&head);
        self.bytes.extend_from_slice(&body);
        (head[4..].try_into().unwrap(), body)
    }

    /// The init segment: `ftyp`, then `moov` with the sample entry `codec` names (`avc1` with
    /// its `avcC`, `hvc1` with its `hvcC`) and a `trex`.
    pub fn init(&mut self, codec: &str) {
        assert_eq!(&self.next_box().0, b"ftyp");
        let (kind, moov) = self.next_box();
        assert_eq!(&kind, b"moov");
        let entry: &[u8; 4] = codec.as_bytes()[..4].try_into().unwrap();
        let record = if entry == b"hvc1" { b"hvcC" } else { b"avcC" };
        for kind in [entry, record] {
            assert!(
                find(&moov, kind).is_some(),
                "no {} in the moov of {codec}",
                String::from_utf8_lossy(kind)
            );
        }
        assert!(find(&moov, b"trex").is_some(), "no trex in the moov");
    }

    /// The next `moof` + `mdat`.
    pub fn fragment(&mut self) -> Fragment {
        let (kind, moof) = self.next_box();
        assert_eq!(&kind, b"moof");
        let (kind, _) = self.next_box();
        assert_eq!(&kind, b"mdat");
        parse_moof(&moof)
    }
}

/// Where the body of the first box `kind` (at any depth, found by its type) starts.
pub fn find(bytes: &[u8], kind: &[u8; 4]) -> Option<usize> {
    bytes.windows(4).position(|w| w == kind).map(|at| at + 4)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// A fragment's times and flags from its `tfdt` (version 1) and `trun` (one sample, with its
/// duration, size, flags and composition offset).
fn parse_moof(moof: &[u8]) -> Fragment {
    let tfdt = find(moof, b"tfdt").unwrap();
    assert_eq!(moof[tfdt], 1, "tfdt version");
    let decode = u64::from_be_bytes(moof[tfdt + 4..tfdt + 12].try_into().unwrap());
    let trun = find(moof, b"trun").unwrap();
    assert_eq!(u32_at(moof, trun + 4), 1, "one sample per fragment");
    // Version and flags, count, data offset, then duration, size, flags, offset.
    let flags = u32_at(moof, trun + 20);
    let offset = i64::from(u32_at(moof, trun + 24) as i32);
    Fragment {
        decode,
        offset,
        keyframe: flags & 0x0001_0000 == 0,
    }
}

/// The presentation time (ticks) of each picture GStreamer decodes from `bytes`, with
/// `codec`'s parser and decoder (`h264`: `h264parse ! avdec_h264`; `h265`); a decoding error
/// fails the test.
pub fn decode(bytes: &[u8], codec: &str) -> Vec<u64> {
    super::gst_init();
    let pipeline = gst::parse::launch(&format!(
        "appsrc name=src caps=video/quicktime,variant=iso ! qtdemux ! {codec}parse ! \
         avdec_{codec} ! appsink name=sink sync=false"
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let by = |name| pipeline.by_name(name).unwrap();
    let src = by("src").downcast::<gst_app::AppSrc>().unwrap();
    let sink = by("sink").downcast::<gst_app::AppSink>().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    src.push_buffer(gst::Buffer::from_slice(bytes.to_vec()))
        .unwrap();
    src.end_of_stream().unwrap();
    let mut times = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        let pts = sample.buffer().unwrap().pts().unwrap();
        times.push(
            ((pts.nseconds() as u128 * TIMESCALE as u128 + 500_000_000) / 1_000_000_000) as u64,
        );
    }
    let error = pipeline
        .bus()
        .unwrap()
        .pop_filtered(&[gst::MessageType::Error]);
    pipeline.set_state(gst::State::Null).unwrap();
    assert!(error.is_none(), "{error:?}");
    times
}
