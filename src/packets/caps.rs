//! What a coded stream's caps say for its MP4 track, whichever codec (`avc.rs`, `hevc.rs`):
//! the picture's size and the decoder configuration record (`codec_data`), when they carry one.
//! No thread.

use gstreamer as gst;

/// What the caps give.
#[derive(Debug)]
pub(super) struct Described {
    pub width: u32,
    pub height: u32,
    /// The `codec_data` record (its version, the first byte, checked to be 1), when the caps
    /// carry one; else the parameter sets are in the stream.
    pub record: Option<Vec<u8>>,
}

/// Why they give too little.
#[derive(Debug)]
pub(super) enum Lacking {
    /// Another media type (its name), or none.
    Other(String),
    NoSize,
    /// A `codec_data` that cannot be a record (unreadable, shorter than `least`, or not of
    /// version 1).
    BadRecord,
}

/// The size and record of `caps` of media type `name`, whose record has at least `least`
/// bytes.
pub(super) fn describe(
    caps: &gst::CapsRef,
    name: &str,
    least: usize,
) -> Result<Described, Lacking> {
    let s = caps
        .structure(0)
        .ok_or_else(|| Lacking::Other("empty caps".to_owned()))?;
    if s.name() != name {
        return Err(Lacking::Other(s.name().to_string()));
    }
    let size = |k: &str| s.get::<i32>(k).ok().and_then(|v| u32::try_from(v).ok());
    let (Some(width), Some(height)) = (size("width"), size("height")) else {
        return Err(Lacking::NoSize);
    };
    let record = match s.get::<gst::Buffer>("codec_data") {
        Ok(data) => {
            let map = data.map_readable().map_err(|_| Lacking::BadRecord)?;
            let record = map.as_slice().to_vec();
            if record.len() < least || record[0] != 1 {
                return Err(Lacking::BadRecord);
            }
            Some(record)
        }
        Err(_) => None,
    };
    Ok(Described {
        width,
        height,
        record,
    })
}
