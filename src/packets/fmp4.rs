//! Fragmented MP4 (ISO/IEC 14496-12) of one H.264 or H.265 track, as a browser's Media Source
//! Extensions take it: an init segment (`ftyp` + `moov` with the sample entry's `avcC` or `hvcC`
//! (`track.rs`) and `mvex`/`trex`, no samples),
//! then a fragment (`moof` + `mdat`) per access unit, so that each picture leaves as soon as it
//! came. Written here, not by GStreamer's `mp4mux fragment-duration`: that muxer waits for
//! a fragment's end, and the HTTP endpoint sends one fragment to many viewers (it is made once).
//!
//! Time: one timescale, [`TIMESCALE`] (90 kHz, the RTP clock of H.264): a sample's decoding
//! time is `tfdt`, its presentation time `tfdt` plus the composition offset (`trun` version 1,
//! signed), and no edit list moves them, so the presentation time a player reports (a
//! browser's `requestVideoFrameCallback` `mediaTime`) is [`ticks`] of the packet's PTS over
//! [`TIMESCALE`]. No thread.

use super::track::Track;

/// Ticks per second of every time written.
pub const TIMESCALE: u32 = 90_000;

/// `t` in ticks of [`TIMESCALE`], rounded to the nearest.
pub fn ticks(t: std::time::Duration) -> u64 {
    let ns = t.as_nanos();
    let ticks = (ns * u128::from(TIMESCALE) + 500_000_000) / 1_000_000_000;
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// A sample's flags (`trun`): a sync sample depends on no other (`sample_depends_on` 2); any
/// other depends on one (1) and is a non-sync sample.
const SYNC: u32 = 0x0200_0000;
const NON_SYNC: u32 = 0x0101_0000;
/// `trun` flags: data offset, and each sample's duration, size, flags and composition offset.
const TRUN_FLAGS: u32 = 0x0000_0f01;
/// `tfhd` flag: offsets are from the `moof`'s start.
const DEFAULT_BASE_IS_MOOF: u32 = 0x0002_0000;
/// The only track's id.
const TRACK: u32 = 1;

/// Appends a box of `kind` whose body `body` writes, its size filled in after.
fn boxed(out: &mut Vec<u8>, kind: &[u8; 4], body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(kind);
    body(out);
    let size = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

/// A full box: a box whose body starts with a version and 24 bits of flags.
fn full(
    out: &mut Vec<u8>,
    kind: &[u8; 4],
    version: u8,
    flags: u32,
    body: impl FnOnce(&mut Vec<u8>),
) {
    boxed(out, kind, |out| {
        out.push(version);
        out.extend_from_slice(&flags.to_be_bytes()[1..]);
        body(out);
    });
}

fn u16s(out: &mut Vec<u8>, values: &[u16]) {
    values
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_be_bytes()));
}

fn u32s(out: &mut Vec<u8>, values: &[u32]) {
    values
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_be_bytes()));
}

/// The unity matrix of `mvhd` and `tkhd`.
const MATRIX: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];

/// The init segment of a stream of `config`.
pub fn init_segment(config: &Track) -> Vec<u8> {
    let mut out = Vec::with_capacity(700 + config.sample_entry().2.len());
    boxed(&mut out, b"ftyp", |o| {
        o.extend_from_slice(b"isom");
        u32s(o, &[0x200]);
        o.extend_from_slice(config.brands());
    });
    boxed(&mut out, b"moov", |o| {
        full(o, b"mvhd", 0, 0, |o| {
            // Times, timescale (ms) and duration (unknown: 0), rate 1.0, volume 1.0.
            u32s(o, &[0, 0, 1000, 0, 0x0001_0000]);
            u16s(o, &[0x0100, 0]);
            u32s(o, &[0, 0]);
            u32s(o, &MATRIX);
            u32s(o, &[0; 6]);
            u32s(o, &[TRACK + 1]);
        });
        boxed(o, b"trak", |o| track(o, config));
        boxed(o, b"mvex", |o| {
            // Default sample description 1; durations, sizes and flags in each `trun`.
            full(o, b"trex", 0, 0, |o| u32s(o, &[TRACK, 1, 0, 0, 0]));
        });
    });
    out
}

/// The `trak` box's body.
fn track(o: &mut Vec<u8>, config: &Track) {
    let (width, height) = config.size();
    // Enabled and in the movie.
    full(o, b"tkhd", 0, 3, |o| {
        u32s(o, &[0, 0, TRACK, 0, 0, 0, 0]);
        // Layer, alternate group, volume, reserved.
        u16s(o, &[0, 0, 0, 0]);
        u32s(o, &MATRIX);
        u32s(o, &[width << 16, height << 16]);
    });
    boxed(o, b"mdia", |o| {
        full(o, b"mdhd", 0, 0, |o| {
            u32s(o, &[0, 0, TIMESCALE, 0]);
            // Language "und", packed as three 5-bit letters.
            u16s(o, &[0x55c4, 0]);
        });
        full(o, b"hdlr", 0, 0, |o| {
            u32s(o, &[0]);
            o.extend_from_slice(b"vide");
            u32s(o, &[0, 0, 0]);
            o.extend_from_slice(b"vidflow\0");
        });
        boxed(o, b"minf", |o| {
            full(o, b"vmhd", 0, 1, |o| u16s(o, &[0, 0, 0, 0]));
            boxed(o, b"dinf", |o| {
                full(o, b"dref", 0, 0, |o| {
                    u32s(o, &[1]);
                    // The media is in this file.
                    full(o, b"url ", 0, 1, |_| {});
                });
            });
            boxed(o, b"stbl", |o| sample_table(o, config));
        });
    });
}

/// The `stbl` box's body: the sample description, and empty tables (the samples are in the
/// fragments).
fn sample_table(o: &mut Vec<u8>, config: &Track) {
    let (entry, record_box, record) = config.sample_entry();
    let (width, height) = config.size();
    full(o, b"stsd", 0, 0, |o| {
        u32s(o, &[1]);
        boxed(o, entry, |o| {
            // Reserved, data reference index 1, pre-defined and reserved.
            u16s(o, &[0, 0, 0, 1, 0, 0]);
            u32s(o, &[0, 0, 0]);
            let size = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
            u16s(o, &[size(width), size(height)]);
            // 72 dpi each way, reserved, one frame per sample, no compressor name.
            u32s(o, &[0x0048_0000, 0x0048_0000, 0]);
            u16s(o, &[1]);
            o.extend_from_slice(&[0; 32]);
            // Depth 24, pre-defined -1.
            u16s(o, &[0x0018, 0xffff]);
            boxed(o, record_box, |o| o.extend_from_slice(record));
        });
    });
    full(o, b"stts", 0, 0, |o| u32s(o, &[0]));
    full(o, b"stsc", 0, 0, |o| u32s(o, &[0]));
    full(o, b"stsz", 0, 0, |o| u32s(o, &[0, 0]));
    full(o, b"stco", 0, 0, |o| u32s(o, &[0]));
}

/// One access unit, on the stream's timeline.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// Its NAL units, length-prefixed as the init segment's `avcC` or `hvcC` says.
    pub data: &'a [u8],
    /// Its decoding time, in ticks of [`TIMESCALE`].
    pub decode: u64,
    /// Its presentation time less its decoding time, in ticks.
    pub offset: i32,
    /// How long it shows, in ticks.
    pub duration: u32,
    pub keyframe: bool,
}

/// The fragment (`moof` + `mdat`) that carries `sample`; `sequence` counts fragments from 1.
pub fn fragment(sequence: u32, sample: &Sample<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(120 + sample.data.len());
    let mut data_offset_at = 0;
    boxed(&mut out, b"moof", |o| {
        full(o, b"mfhd", 0, 0, |o| u32s(o, &[sequence]));
        boxed(o, b"traf", |o| {
            full(o, b"tfhd", 0, DEFAULT_BASE_IS_MOOF, |o| u32s(o, &[TRACK]));
            full(o, b"tfdt", 1, 0, |o| {
                o.extend_from_slice(&sample.decode.to_be_bytes());
            });
            full(o, b"trun", 1, TRUN_FLAGS, |o| {
                u32s(o, &[1]);
                data_offset_at = o.len();
                u32s(o, &[0]);
                let size = u32::try_from(sample.data.len()).unwrap_or(u32::MAX);
                let flags = if sample.keyframe { SYNC } else { NON_SYNC };
                u32s(o, &[sample.duration, size, flags]);
                o.extend_from_slice(&sample.offset.to_be_bytes());
            });
        });
    });
    // The sample's data starts after the `moof` and the `mdat`'s own header.
    let data_offset = u32::try_from(out.len() + 8).unwrap_or(u32::MAX);
    out[data_offset_at..data_offset_at + 4].copy_from_slice(&data_offset.to_be_bytes());
    boxed(&mut out, b"mdat", |o| o.extend_from_slice(sample.data));
    out
}

#[cfg(test)]
mod tests;
