//! The GStreamer launch line that replays an MP4 file as a camera sends it over RTSP:
//! `filesrc ! qtdemux ! h264parse ! rtph264pay` (`h265` for an H.265 file), nothing decoded
//! or encoded. Shared by the tests' `FileServer` (rtsp_files.rs) and `examples/rtsp_replay.rs`
//! (the benchmarks' cameras), which include this file.

use std::path::Path;

use anyhow::Context as _;

/// The media factory's launch line for `file`, with `before_pay` (elements ending in ` ! `,
/// or empty) between the parser and the payloader.
pub(crate) fn launch(file: &Path, before_pay: &str) -> anyhow::Result<String> {
    let codec = codec_of(file)?;
    Ok(format!(
        "( filesrc location=\"{}\" ! qtdemux ! {codec}parse ! {before_pay}\
         rtp{codec}pay name=pay0 pt=96 config-interval=-1 )",
        file.display()
    ))
}

/// `"h265"` for an MP4 file whose video is H.265 (its sample entry `hvc1` or `hev1`), else
/// `"h264"`.
fn codec_of(file: &Path) -> anyhow::Result<&'static str> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let h265 = bytes.windows(4).any(|w| w == b"hvc1" || w == b"hev1");
    Ok(if h265 { "h265" } else { "h264" })
}
