//! H.265 as an MP4 file holds it: the decoder configuration record (`hvcC`, ISO/IEC 14496-15
//! 8.3.3) and access units as length-prefixed NAL units, made from either form a GStreamer
//! parser gives (`stream-format=hvc1` or `hev1` with its `codec_data`, or `byte-stream`,
//! Annex B start codes, with the parameter sets in band), and the codec string a browser is
//! asked about (ISO/IEC 14496-15 Annex E, as RFC 6381 carries it: `hvc1.1.6.L93.B0`). The
//! framing of NAL units is H.264's (`avc.rs`); only the NAL header (two bytes) differs. No
//! thread; nothing here decodes.

use std::borrow::Cow;

use gstreamer as gst;

use super::avc::{Framing, length_prefixed, nal_units};
use super::caps::{Described, Lacking, describe};

/// NAL unit types read here (ITU-T H.265 table 7-1).
const NAL_VPS: u8 = 32;
const NAL_SPS: u8 = 33;
const NAL_PPS: u8 = 34;
const NAL_AUD: u8 = 35;
/// Intra random access points (BLA, IDR, CRA and the reserved IRAP types): a decoder can
/// start at one.
const IRAP: std::ops::RangeInclusive<u8> = 16..=23;
/// The record's fixed part: up to and including `numOfArrays`.
const HEADER: usize = 23;

/// A NAL unit's type, from its two-byte header.
pub fn nal_type(nal: &[u8]) -> Option<u8> {
    nal.first().map(|b| (b >> 1) & 0x3f)
}

/// Whether an access unit framed as `framing` is a keyframe: it holds an IRAP picture.
pub fn is_keyframe(unit: &[u8], framing: Framing) -> bool {
    nal_units(unit, framing)
        .iter()
        .any(|nal| nal_type(nal).is_some_and(|t| IRAP.contains(&t)))
}

/// An H.265 stream's decoder configuration: what an MP4 init segment carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HevcConfig {
    /// The `hvcC` box's payload (an HEVCDecoderConfigurationRecord).
    pub record: Vec<u8>,
    /// The picture's size, from the caps.
    pub width: u32,
    pub height: u32,
    /// How the samples written with this configuration are framed (the record says the same
    /// length size).
    pub framing: Framing,
}

/// Why a stream's packets cannot go into MP4 as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HevcError {
    #[error("not H.265 but {0}")]
    NotH265(String),
    #[error("its caps give no picture size")]
    NoSize,
    #[error("its codec_data is not an hvcC record")]
    BadCodecData,
    #[error("its sequence parameter set cannot be read")]
    BadSps,
}

impl HevcConfig {
    /// The configuration `caps` give (`hvc1` or `hev1`: its `codec_data`), or, for a byte
    /// stream, the one the parameter sets in `keyframe` make (`None`: this packet has none, a
    /// later keyframe may).
    pub fn of(caps: &gst::CapsRef, keyframe: &[u8]) -> Result<Option<Self>, HevcError> {
        let Described {
            width,
            height,
            record: given,
        } = describe(caps, "video/x-h265", HEADER).map_err(|lacking| match lacking {
            Lacking::Other(name) => HevcError::NotH265(name),
            Lacking::NoSize => HevcError::NoSize,
            Lacking::BadRecord => HevcError::BadCodecData,
        })?;
        if let Some(record) = given {
            let length_size = usize::from(record[21] & 0x03) + 1;
            return Ok(Some(Self {
                record,
                width,
                height,
                framing: Framing::Avc { length_size },
            }));
        }
        let (mut vps, mut sps, mut pps) = (Vec::new(), Vec::new(), Vec::new());
        for nal in nal_units(keyframe, Framing::ByteStream) {
            match nal_type(nal) {
                Some(NAL_VPS) => vps.push(nal),
                Some(NAL_SPS) => sps.push(nal),
                Some(NAL_PPS) => pps.push(nal),
                _ => {}
            }
        }
        if vps.is_empty() || sps.is_empty() || pps.is_empty() {
            return Ok(None);
        }
        let info = Sps::read(sps[0]).ok_or(HevcError::BadSps)?;
        Ok(Some(Self {
            record: record(&info, &[(NAL_VPS, &vps), (NAL_SPS, &sps), (NAL_PPS, &pps)]),
            width,
            height,
            framing: Framing::ByteStream,
        }))
    }

    /// The codec string of ISO/IEC 14496-15 Annex E for `MediaSource.isTypeSupported`:
    /// `hvc1.`, the profile space (a letter, none for 0) and profile, the compatibility flags
    /// in reverse bit order (hex), the tier (`L` main, `H` high) and level, then each byte of
    /// the constraint flags (hex) up to the last that is not zero.
    pub fn codec(&self) -> String {
        let r = &self.record;
        let space = ["", "A", "B", "C"][usize::from(r[1] >> 6)];
        let tier = if r[1] & 0x20 != 0 { 'H' } else { 'L' };
        let compat = u32::from_be_bytes([r[2], r[3], r[4], r[5]]).reverse_bits();
        let mut out = format!("hvc1.{space}{}.{compat:X}.{tier}{}", r[1] & 0x1f, r[12]);
        let constraints = &r[6..12];
        let used = constraints
            .iter()
            .rposition(|b| *b != 0)
            .map_or(0, |i| i + 1);
        for b in &constraints[..used] {
            out.push_str(&format!(".{b:02X}"));
        }
        out
    }

    /// An access unit of this stream as MP4 holds it: unchanged when it is length-prefixed,
    /// else each NAL unit after a 4-byte length (access unit delimiters left out; the
    /// parameter sets kept, as the H.264 writer keeps them).
    pub fn sample<'a>(&self, unit: &'a [u8]) -> Cow<'a, [u8]> {
        match self.framing {
            Framing::Avc { .. } => Cow::Borrowed(unit),
            Framing::ByteStream => {
                Cow::Owned(length_prefixed(unit, |nal| nal_type(nal) == Some(NAL_AUD)))
            }
        }
    }

    /// Its parameter sets, without the rest of the record: two configurations with the
    /// same ones decode the same stream.
    pub fn parameter_sets(&self) -> &[u8] {
        self.record.get(HEADER - 1..).unwrap_or_default()
    }
}

/// What the record takes of a sequence parameter set.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sps {
    /// `profile_tier_level`'s general part: profile space, tier and profile (1 byte), the
    /// compatibility flags (4), the constraint flags (6) and the level (1).
    general: [u8; 12],
    max_sub_layers: u8,
    temporal_id_nesting: bool,
    chroma_format_idc: u8,
    bit_depth_luma_minus8: u8,
    bit_depth_chroma_minus8: u8,
}

impl Sps {
    /// Reads `nal` (a sequence parameter set, with its header) as far as the bit depths
    /// (ITU-T H.265 7.3.2.2).
    fn read(nal: &[u8]) -> Option<Self> {
        let rbsp = unescape(nal.get(2..)?);
        let mut r = Bits { data: &rbsp, at: 0 };
        r.u(4)?; // sps_video_parameter_set_id
        let max_sub_layers_minus1 = r.u(3)?;
        let temporal_id_nesting = r.u(1)? == 1;
        // The general profile, tier and level: 96 bits from the second byte on, whole bytes.
        let general: [u8; 12] = rbsp.get(1..13)?.try_into().ok()?;
        r.at += 96;
        let subs = usize::try_from(max_sub_layers_minus1).ok()?;
        let mut present = Vec::with_capacity(subs);
        for _ in 0..subs {
            present.push((r.u(1)? == 1, r.u(1)? == 1));
        }
        if subs > 0 {
            r.at += 2 * (8 - subs);
        }
        for (profile, level) in present {
            r.at += 88 * usize::from(profile) + 8 * usize::from(level);
        }
        r.ue()?; // sps_seq_parameter_set_id
        let chroma_format_idc = r.ue()?;
        if chroma_format_idc == 3 {
            r.u(1)?; // separate_colour_plane_flag
        }
        r.ue()?; // pic_width_in_luma_samples
        r.ue()?; // pic_height_in_luma_samples
        if r.u(1)? == 1 {
            for _ in 0..4 {
                r.ue()?; // conformance window offsets
            }
        }
        let small = |v: u32| u8::try_from(v).ok();
        Some(Self {
            general,
            max_sub_layers: small(max_sub_layers_minus1 + 1)?,
            temporal_id_nesting,
            chroma_format_idc: small(chroma_format_idc)?,
            bit_depth_luma_minus8: small(r.ue()?)?,
            bit_depth_chroma_minus8: small(r.ue()?)?,
        })
    }
}

/// An HEVCDecoderConfigurationRecord of `sps` and these arrays of parameter sets (each its
/// NAL type and units), with 4-byte lengths; no minimum spatial segmentation, parallelism or
/// frame rate said (0: unknown), as GStreamer's own `h265parse` writes it, but for the arrays'
/// completeness, which an `hvc1` sample entry asks (14496-15 8.3.3.1.2) and `h265parse` leaves
/// out.
fn record(sps: &Sps, arrays: &[(u8, &Vec<&[u8]>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(1);
    out.extend_from_slice(&sps.general);
    out.extend_from_slice(&[
        0xf0,
        0x00,
        0xfc,
        0xfc | (sps.chroma_format_idc & 0x03),
        0xf8 | (sps.bit_depth_luma_minus8 & 0x07),
        0xf8 | (sps.bit_depth_chroma_minus8 & 0x07),
        0,
        0,
        ((sps.max_sub_layers & 0x07) << 3) | (u8::from(sps.temporal_id_nesting) << 2) | 3,
    ]);
    out.push(u8::try_from(arrays.len()).unwrap_or(u8::MAX));
    for (kind, nals) in arrays {
        // array_completeness: every set of this type is in the array (`hvc1` asks it).
        out.push(0x80 | kind);
        let count = nals.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&u16::try_from(count).unwrap_or(u16::MAX).to_be_bytes());
        for nal in nals.iter().take(count) {
            out.extend_from_slice(&u16::try_from(nal.len()).unwrap_or(u16::MAX).to_be_bytes());
            out.extend_from_slice(nal);
        }
    }
    out
}

/// A NAL unit's payload without its emulation-prevention bytes (`00 00 03` is `00 00`).
fn unescape(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len());
    let mut zeros = 0;
    for &b in payload {
        if zeros >= 2 && b == 3 {
            zeros = 0;
            continue;
        }
        zeros = if b == 0 { zeros + 1 } else { 0 };
        out.push(b);
    }
    out
}

/// Reads bits, most significant first.
struct Bits<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    /// The next `n` bits (at most 32).
    fn u(&mut self, n: usize) -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..n {
            let byte = self.data.get(self.at / 8)?;
            v = (v << 1) | u32::from((byte >> (7 - self.at % 8)) & 1);
            self.at += 1;
        }
        Some(v)
    }

    /// An unsigned Exp-Golomb number (`ue(v)`).
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.u(1)? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        Some((1u32 << zeros) - 1 + self.u(zeros)?)
    }
}

#[cfg(test)]
mod tests;
