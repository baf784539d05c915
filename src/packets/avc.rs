//! H.264 as an MP4 file holds it: the decoder configuration record (`avcC`, ISO/IEC 14496-15
//! 5.3.3) and access units as length-prefixed NAL units, made from either form a GStreamer
//! parser gives (`stream-format=avc` with its `codec_data`, or `byte-stream`, Annex B start
//! codes, with the parameter sets in band), and the codec string a browser is asked about
//! (RFC 6381: `avc1.PPCCLL`). No thread; nothing here decodes.

use std::borrow::Cow;

use gstreamer as gst;

use super::caps::{Described, Lacking, describe};

/// NAL unit types read here (ITU-T H.264 table 7-1).
const NAL_SPS: u8 = 7;
const NAL_PPS: u8 = 8;
const NAL_AUD: u8 = 9;

/// How a stream's access units are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Each NAL unit after its length, in this many bytes (1 to 4, from `codec_data`).
    Avc { length_size: usize },
    /// Annex B: each NAL unit after a start code (`00 00 01`, or `00 00 00 01`).
    ByteStream,
}

/// An H.264 stream's decoder configuration: what an MP4 init segment carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvcConfig {
    /// The `avcC` box's payload (an AVCDecoderConfigurationRecord).
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
pub enum AvcError {
    #[error("not H.264 but {0}")]
    NotH264(String),
    #[error("its caps give no picture size")]
    NoSize,
    #[error("its codec_data is not an avcC record")]
    BadCodecData,
    #[error("its keyframe carries no sequence and picture parameter sets")]
    NoParameterSets,
}

impl AvcConfig {
    /// The configuration `caps` give (`stream-format=avc`: its `codec_data`), or, for a
    /// byte stream, the one the parameter sets in `keyframe` make (`None`: this packet has
    /// none, a later keyframe may).
    pub fn of(caps: &gst::CapsRef, keyframe: &[u8]) -> Result<Option<Self>, AvcError> {
        let Described {
            width,
            height,
            record: given,
        } = describe(caps, "video/x-h264", 7).map_err(|lacking| match lacking {
            Lacking::Other(name) => AvcError::NotH264(name),
            Lacking::NoSize => AvcError::NoSize,
            Lacking::BadRecord => AvcError::BadCodecData,
        })?;
        if let Some(record) = given {
            let length_size = usize::from(record[4] & 0x03) + 1;
            return Ok(Some(Self {
                record,
                width,
                height,
                framing: Framing::Avc { length_size },
            }));
        }
        let mut sps = Vec::new();
        let mut pps = Vec::new();
        for nal in nal_units(keyframe, Framing::ByteStream) {
            match nal.first().map(|b| b & 0x1f) {
                Some(NAL_SPS) if nal.len() >= 4 => sps.push(nal),
                Some(NAL_PPS) => pps.push(nal),
                _ => {}
            }
        }
        if sps.is_empty() || pps.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            record: record(&sps, &pps),
            width,
            height,
            framing: Framing::ByteStream,
        }))
    }

    /// The codec string of RFC 6381 for `MediaSource.isTypeSupported`: `avc1.` and the
    /// profile, constraint flags and level of the sequence parameter set, in hex.
    pub fn codec(&self) -> String {
        format!(
            "avc1.{:02x}{:02x}{:02x}",
            self.record[1], self.record[2], self.record[3]
        )
    }

    /// An access unit of this stream as MP4 holds it: unchanged when it is length-prefixed,
    /// else each NAL unit after a 4-byte length (access unit delimiters left out).
    pub fn sample<'a>(&self, unit: &'a [u8]) -> Cow<'a, [u8]> {
        match self.framing {
            Framing::Avc { .. } => Cow::Borrowed(unit),
            Framing::ByteStream => Cow::Owned(length_prefixed(unit, |nal| {
                nal.first().map(|b| b & 0x1f) == Some(NAL_AUD)
            })),
        }
    }

    /// Its parameter sets, without the rest of the record: two configurations with the
    /// same ones decode the same stream.
    pub fn parameter_sets(&self) -> &[u8] {
        self.record.get(5..).unwrap_or_default()
    }
}

/// Each NAL unit of a byte-stream access unit after a 4-byte length, as MP4 holds them, but
/// those `left_out` says (access unit delimiters).
pub(super) fn length_prefixed(unit: &[u8], left_out: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(unit.len() + 16);
    for nal in nal_units(unit, Framing::ByteStream) {
        if left_out(nal) {
            continue;
        }
        let len = u32::try_from(nal.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(nal);
    }
    out
}

/// An AVCDecoderConfigurationRecord of these parameter sets, with 4-byte lengths.
fn record(sps: &[&[u8]], pps: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![1, sps[0][1], sps[0][2], sps[0][3], 0xfc | 3];
    out.push(0xe0 | u8::try_from(sps.len().min(31)).unwrap_or(31));
    for s in sps.iter().take(31) {
        out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(s);
    }
    out.push(u8::try_from(pps.len().min(255)).unwrap_or(255));
    for p in pps.iter().take(255) {
        out.extend_from_slice(&u16::try_from(p.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The NAL units of an access unit framed as `framing` (a truncated last one is cut short).
pub fn nal_units(unit: &[u8], framing: Framing) -> Vec<&[u8]> {
    let mut out = Vec::new();
    match framing {
        Framing::Avc { length_size } => {
            let mut at = 0;
            while at + length_size <= unit.len() {
                let len = unit[at..at + length_size]
                    .iter()
                    .fold(0usize, |n, b| (n << 8) | usize::from(*b));
                at += length_size;
                let end = (at + len).min(unit.len());
                out.push(&unit[at..end]);
                at = end;
            }
        }
        Framing::ByteStream => {
            // Each start code's end; a unit runs to the next start code (its trailing zero
            // bytes, a 4-byte code's first, dropped).
            let starts: Vec<usize> = unit
                .windows(3)
                .enumerate()
                .filter(|(_, w)| *w == [0, 0, 1])
                .map(|(i, _)| i + 3)
                .collect();
            for (n, &start) in starts.iter().enumerate() {
                let mut end = starts.get(n + 1).map_or(unit.len(), |next| next - 3);
                while end > start && unit[end - 1] == 0 && starts.get(n + 1).is_some() {
                    end -= 1;
                }
                if end > start {
                    out.push(&unit[start..end]);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_stream_keyframe_makes_the_record_and_its_samples_are_length_prefixed() {
        gst::init().unwrap();
        let sps = [0x67, 0x64, 0x00, 0x1f, 0xac, 0xd9];
        let pps = [0x68, 0xeb, 0xe3, 0xcb];
        let idr = [0x65, 0x88, 0x84, 0x00, 0x00, 0x03, 0x00];
        let mut unit = vec![0, 0, 0, 1, 0x09, 0xf0];
        for nal in [&sps[..], &pps, &idr] {
            unit.extend_from_slice(&[0, 0, 0, 1]);
            unit.extend_from_slice(nal);
        }
        let caps = gst::Caps::builder("video/x-h264")
            .field("stream-format", "byte-stream")
            .field("width", 1920)
            .field("height", 1080)
            .build();
        let config = AvcConfig::of(&caps, &unit).unwrap().unwrap();
        assert_eq!(config.codec(), "avc1.64001f");
        assert_eq!((config.width, config.height), (1920, 1080));
        assert_eq!(&config.record[..6], &[1, 0x64, 0, 0x1f, 0xff, 0xe1]);
        let sample = config.sample(&unit);
        let nals = nal_units(&sample, Framing::Avc { length_size: 4 });
        // The delimiter is left out; the idr keeps its emulation-prevention bytes and its
        // trailing zero.
        assert_eq!(nals, vec![&sps[..], &pps[..], &idr[..]]);
        // A delta frame alone has no parameter sets: no configuration from it.
        assert_eq!(AvcConfig::of(&caps, &[0, 0, 1, 0x41, 0x9a]).unwrap(), None);
        let h265 = gst::Caps::new_empty_simple("video/x-h265");
        assert_eq!(
            AvcConfig::of(&h265, &unit),
            Err(AvcError::NotH264("video/x-h265".to_owned()))
        );
    }
}
