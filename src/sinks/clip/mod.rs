//! `clip`: event recording like a security NVR: one short video per event, from `pre_roll_s`
//! before it to `post_roll_s` after its last trigger (a frame whose `when` value is non-empty),
//! each clip a fragmented MP4 (a crash leaves it playable up to its last fragment) named so it
//! never overwrites, indexed in the storage and listed in `clips.jsonl` once finished
//! (`file.rs`).
//!
//! Two modes, one per sink:
//! - `encode` (the default, `encode.rs`): the decoded images given (`image`) encoded with x264,
//!   so a clip can show what a step drew;
//! - `packets` (`packets.rs`): the camera's own encoded stream, the source's record stream
//!   (`record_uri`, else `uri`'s: `crate::packets`), copied as sent, never decoded nor encoded.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::common::when::{WHEN_EVENTS_DOC, When};
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::spec::{Diagnostic, ParamDoc, Params, SinkInput};
use crate::storage::{Class, FilePolicy, Retention};

mod encode;
mod file;
mod packets;
mod timing;

pub(super) static KIND: SinkKind = SinkKind {
    name: "clip",
    summary: "one MP4 clip per event, from pre_roll_s before it to post_roll_s after it: \
              encoded from images, or the camera's own packets",
    inputs: &[
        // Packets mode copies the camera's own stream: it reads no image.
        super::SinkPort {
            optional_with: Some(("mode", "packets")),
            ..super::IMAGE_PORT
        },
        super::WHEN_PORT,
    ],
    params: &[
        ParamDoc {
            name: "dir",
            ty: "path",
            default: "required",
            doc: "folder of the clips (created): SOURCE-TIME.mp4 and an index clips.jsonl",
        },
        ParamDoc {
            name: "mode",
            ty: "\"encode\" | \"packets\"",
            default: "\"encode\"",
            doc: "encode: the images given (image), encoded with x264; packets: the camera's \
                  own H.264/H.265 stream (record_uri, else uri), copied as sent, never \
                  encoded (image is then not needed)",
        },
        ParamDoc {
            name: "pre_roll_s",
            ty: "float",
            default: "5.0",
            doc: "video kept from before the first trigger (at least this, from a keyframe; \
                  in packets mode as far as its ring's 256 MiB holds at the camera's bitrate, \
                  600 s up to 2.1 Mbit/s)",
        },
        ParamDoc {
            name: "post_roll_s",
            ty: "float",
            default: "5.0",
            doc: "video kept after the last trigger; a trigger within it extends the clip",
        },
        ParamDoc {
            name: "max_clip_s",
            ty: "float",
            default: "300.0",
            doc: "longest clip; a longer event goes on in a new clip",
        },
        ParamDoc {
            name: "keyframe_s",
            ty: "float",
            default: "1.0",
            doc: "keyframe interval: how close to pre_roll_s a clip can start (encode only: \
                  in packets mode the camera's keyframes decide)",
        },
        ParamDoc {
            name: "preset",
            ty: "string",
            default: "\"veryfast\"",
            doc: "x264 speed preset (encode only)",
        },
        ParamDoc {
            name: "bitrate_kbps",
            ty: "integer",
            default: "2048",
            doc: "target bitrate (encode only)",
        },
        WHEN_EVENTS_DOC,
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

/// What a second of a camera's own stream is taken to weigh, to check `max_gb` against one
/// clip in packets mode: a 1080p camera at 4 Mbit/s.
const CAMERA_BYTES_PER_SECOND: u64 = 500_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    dir: PathBuf,
    mode: Option<Spanned<String>>,
    pre_roll_s: Option<Spanned<f64>>,
    post_roll_s: Option<Spanned<f64>>,
    max_clip_s: Option<Spanned<f64>>,
    keyframe_s: Option<Spanned<f64>>,
    preset: Option<Spanned<String>>,
    bitrate_kbps: Option<Spanned<u32>>,
    events: Option<Spanned<Vec<Spanned<String>>>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

#[derive(Debug, Clone)]
struct Settings {
    dir: PathBuf,
    pre_roll: Duration,
    post_roll: Duration,
    max_clip: Duration,
    keyframe: Duration,
    preset: String,
    bitrate_kbps: u32,
}

/// A duration parameter within `range` seconds, or `default`.
fn seconds(
    name: &str,
    value: Option<Spanned<f64>>,
    default: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Duration, Diagnostic> {
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(default));
    };
    if !range.contains(v.get_ref()) {
        return Err(Diagnostic::at(
            v.span(),
            format!(
                "{name} must be between {} and {}, not {}",
                range.start(),
                range.end(),
                v.get_ref()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(*v.get_ref()))
}

/// Whether `mode` asks for packets; an unknown mode is refused, quoted.
fn packets_mode(mode: Option<&Spanned<String>>) -> Result<bool, Diagnostic> {
    match mode.map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("encode", _)) => Ok(false),
        Some(("packets", _)) => Ok(true),
        Some((other, span)) => Err(Diagnostic::at(
            span,
            format!("mode must be \"encode\" or \"packets\", not \"{other}\""),
        )),
    }
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let packets = packets_mode(c.mode.as_ref())?;
    if packets {
        // The camera's own stream is copied: nothing here is encoded.
        let encoding = [
            ("keyframe_s", c.keyframe_s.as_ref().map(Spanned::span)),
            ("preset", c.preset.as_ref().map(Spanned::span)),
            ("bitrate_kbps", c.bitrate_kbps.as_ref().map(Spanned::span)),
        ];
        if let Some((key, Some(span))) = encoding.into_iter().find(|(_, s)| s.is_some()) {
            return Err(Diagnostic::at(
                span,
                format!(
                    "{key} is for mode = \"encode\": in mode = \"packets\" the camera's own \
                     stream is copied, with its own keyframes and bitrate"
                ),
            ));
        }
    }
    let (preset, bitrate_kbps) = super::video_file::encoder_options(c.preset, c.bitrate_kbps)?;
    let settings = Settings {
        dir: c.dir,
        pre_roll: seconds("pre_roll_s", c.pre_roll_s, 5.0, 0.0..=600.0)?,
        post_roll: seconds("post_roll_s", c.post_roll_s, 5.0, 0.0..=600.0)?,
        max_clip: seconds("max_clip_s", c.max_clip_s, 300.0, 1.0..=86_400.0)?,
        keyframe: seconds("keyframe_s", c.keyframe_s, 1.0, 0.1..=60.0)?,
        preset,
        bitrate_kbps,
    };
    // A clip of an event as short as it can be (pre-roll and post-roll) must fit.
    let bytes_per_s = if packets {
        CAMERA_BYTES_PER_SECOND
    } else {
        u64::from(settings.bitrate_kbps) * 125
    };
    let shortest = (settings.pre_roll + settings.post_roll).as_secs().max(1) * bytes_per_s;
    let policy = FilePolicy {
        class: Class::Event,
        retention: Retention::parse(
            c.retain_days,
            c.max_gb,
            Some((shortest, "clip of pre_roll_s + post_roll_s")),
        )?,
        expected_file: shortest * 3 / 2,
    };
    Ok(Box::new(Factory {
        settings,
        events: When::parse_events(c.events)?,
        policy,
        packets: packets.then(Vec::new),
    }))
}

#[derive(Debug)]
struct Factory {
    settings: Settings,
    /// The event kinds that trigger (`events`), all when `None`.
    events: Option<Vec<crate::value::EventKind>>,
    policy: FilePolicy,
    /// In packets mode, the sources it takes (told at resolution,
    /// [`SinkFactory::takes_packets`]); `None` in encode mode.
    packets: Option<Vec<Arc<str>>>,
}

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let dir = &self.settings.dir;
        std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
            path: dir.clone(),
            source,
        })?;
        crate::gst_setup::init().map_err(|message| SinkError::Gstreamer {
            path: dir.clone(),
            message,
        })?;
        let image = inputs.iter().find(|i| i.port == "image").map(|i| i.from);
        let when = When::new(inputs, self.events.clone());
        let files = storage.sink(name, self.policy);
        let settings = self.settings.clone();
        Ok(match &self.packets {
            None => {
                // Validation refuses an encoding clip without image (`optional_with`).
                let image = image.ok_or_else(|| {
                    SinkError::Other(format!("sink \"{name}\": no image input to encode"))
                })?;
                Box::new(encode::ClipSink::new(files, settings, image, when))
            }
            Some(sources) => Box::new(packets::PacketClips::open(
                name, sources, files, settings, when,
            )?),
        })
    }

    fn images_of(&self, width: u32, height: u32) -> Result<Option<String>, String> {
        if self.packets.is_some() {
            // The images are not recorded: the camera's packets are.
            return Ok(None);
        }
        super::video_file::size::images_of(width, height)
    }

    fn takes_packets(&mut self, sources: &[Arc<str>]) -> bool {
        match &mut self.packets {
            Some(taken) => {
                *taken = sources.to_vec();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_mode_takes_packets_and_refuses_encoder_keys() {
        let mut f = build(Params::from_toml("dir = \"c\"\nmode = \"packets\"")).unwrap();
        assert!(f.takes_packets(&["cam".into()]));
        let mut encode = build(Params::from_toml("dir = \"c\"")).unwrap();
        assert!(!encode.takes_packets(&["cam".into()]));
        let e = build(Params::from_toml("dir = \"c\"\nmode = \"copy\"")).unwrap_err();
        assert!(e.message.contains("not \"copy\""), "{}", e.message);
        let e = build(Params::from_toml(
            "dir = \"c\"\nmode = \"packets\"\nkeyframe_s = 2.0",
        ))
        .unwrap_err();
        assert!(e.message.starts_with("keyframe_s is for"), "{}", e.message);
    }
}
