//! Frame sizes H.264 can record: what `video_file` and `clip` encode an image of any size at.
//!
//! x264 encodes 4:2:0 only at even widths and heights ("width not divisible by 2", then "Can
//! not initialize x264 encoder"), and at most [`MAX_SIDE`] pixels a side; `mp4mux` takes no
//! H.264 narrower or shorter than [`MIN_SIDE`] (it refuses the caps, and no file is made). So
//! an image of another size is padded: its last column and row are repeated up to the next
//! even size of at least [`MIN_SIDE`] (a 641x481 camera is recorded at 642x482, a 3x3 crop at
//! 16x16 with the picture in its top-left corner). Nothing of the image is cut off. A side over
//! [`MAX_SIDE`] cannot be recorded: that is an error, said once, and its frames are dropped.

use std::collections::HashSet;

/// Smallest width and height `mp4mux` takes (its caps: `width: [ 16, MAX ]`).
pub(crate) const MIN_SIDE: u32 = 16;
/// Largest width and height x264 encodes (GStreamer 1.22's x264 refuses 16400x16).
pub(crate) const MAX_SIDE: u32 = 16384;

/// The size an image of `width` x `height` is encoded at: the same, or padded to even sides of
/// at least [`MIN_SIDE`]. An error (its message) when a side is over [`MAX_SIDE`].
pub(crate) fn coded_size(width: u32, height: u32) -> Result<(u32, u32), String> {
    if width > MAX_SIDE || height > MAX_SIDE || width == 0 || height == 0 {
        return Err(format!(
            "images of {width}x{height} cannot be recorded: H.264 (x264) takes 1 to {MAX_SIDE} \
             pixels a side; resize them first"
        ));
    }
    let side = |v: u32| (v + v % 2).max(MIN_SIDE);
    Ok((side(width), side(height)))
}

/// What is done to images of `width` x `height` to record them, when they are not recorded as
/// they are: padded (to which size, and why), or refused.
pub(crate) fn size_note(width: u32, height: u32) -> Option<String> {
    match coded_size(width, height) {
        Ok(coded) if coded == (width, height) => None,
        Ok((w, h)) => Some(format!(
            "images of {width}x{height} are recorded padded to {w}x{h} (their last column and \
             row repeated): H.264 needs even sides of at least {MIN_SIDE} pixels"
        )),
        Err(e) => Some(e),
    }
}

/// What validation says of images of `width` x `height` known in advance (see
/// [`crate::sinks::SinkFactory::images_of`]): a note when they are padded, a problem when they
/// cannot be recorded.
pub(crate) fn images_of(width: u32, height: u32) -> Result<Option<String>, String> {
    coded_size(width, height).map(|_| size_note(width, height))
}

/// Sizes already said in the log: each padded or refused size is logged once per sink.
#[derive(Debug, Default)]
pub(crate) struct SaidOnce(HashSet<(u32, u32)>);

impl SaidOnce {
    /// Logs at warning what is done to images of `width` x `height` of `source`, the first
    /// time that size comes; nothing for a size recorded as it is.
    pub(crate) fn say(&mut self, sink: &str, source: &str, width: u32, height: u32) {
        let Some(note) = size_note(width, height) else {
            return;
        };
        if self.0.insert((width, height)) {
            tracing::warn!(source = %source, "{sink}: {note}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_tiny_sizes_are_padded_to_even_sides_of_at_least_16() {
        assert_eq!(coded_size(640, 480), Ok((640, 480)));
        assert_eq!(coded_size(641, 481), Ok((642, 482)));
        assert_eq!(coded_size(101, 75), Ok((102, 76)));
        assert_eq!(coded_size(17, 17), Ok((18, 18)));
        assert_eq!(coded_size(3, 3), Ok((16, 16)));
        assert_eq!(coded_size(1, 1000), Ok((16, 1000)));
        assert_eq!(coded_size(MAX_SIDE, MAX_SIDE - 1), Ok((MAX_SIDE, MAX_SIDE)));
        assert!(coded_size(MAX_SIDE + 1, 16).is_err());
        assert!(coded_size(0, 16).is_err());
        assert_eq!(size_note(640, 480), None);
        let note = size_note(641, 481).unwrap();
        assert!(
            note.contains("641x481") && note.contains("642x482"),
            "{note}"
        );
    }
}
