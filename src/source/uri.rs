//! Source URIs: what the user wrote in `uri = "..."`, parsed and checked.
//!
//! An RTSP URL is parsed once, as a [`spec::Address`](crate::spec::Address) (the `url` crate):
//! that parse gives GStreamer its location (without user and password, which go to rtspsrc apart)
//! and gives `Display` what it shows (the password as `***`); every error and log line goes
//! through `Display`. How a password with `#`, `?`, `/`, `@` or `%` is written, and what is
//! refused, is in `spec/address.rs`.

use std::fmt;
use std::path::PathBuf;

pub use crate::spec::redact;
use crate::spec::{Address, AddressError, Secret, percent_decode};

/// A parsed source URI.
#[derive(Clone, PartialEq, Eq)]
pub enum SourceUri {
    /// `file:///path` or a plain path.
    File { path: PathBuf },
    /// `rtsp://` or `rtsps://`, its credentials taken apart.
    Rtsp { address: Address },
    /// `v4l2:///dev/videoN?width=..&height=..&fps=..&format=mjpg|raw`.
    V4l2 {
        device: PathBuf,
        width: Option<u32>,
        height: Option<u32>,
        fps: Option<u32>,
        format: Option<CameraFormat>,
    },
    /// `test://PATTERN?width=..&height=..&fps=..&frames=..&live=..&pool=..` (GStreamer
    /// videotestsrc).
    Test(TestPattern),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CameraFormat {
    Mjpg,
    Raw,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestPattern {
    pub pattern: String,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    /// Stop after this many frames; unlimited when `None`.
    pub frames: Option<u64>,
    /// Paced in real time (a live source) or as fast as frames are taken.
    pub live: bool,
    /// Draw the frames into a fixed pool of this many buffers, as a camera driver or a hardware
    /// decoder does, to try what vidflow does with such a pool without the hardware; `None`: a
    /// pool that grows as needed.
    pub pool: Option<u32>,
}

/// Why a URI was refused. Messages never contain a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("empty uri")]
    Empty,
    #[error("unsupported scheme \"{0}\" (use file://, rtsp://, rtsps://, v4l2:// or test://)")]
    Scheme(String),
    #[error("\"{uri}\": {reason}")]
    Invalid { uri: String, reason: String },
    #[error(transparent)]
    Address(#[from] AddressError),
}

/// Patterns of GStreamer's videotestsrc, by nick.
const PATTERNS: &[&str] = &[
    "smpte",
    "snow",
    "black",
    "white",
    "red",
    "green",
    "blue",
    "checkers-1",
    "checkers-2",
    "checkers-4",
    "checkers-8",
    "circular",
    "blink",
    "smpte75",
    "zone-plate",
    "gamut",
    "chroma-zone-plate",
    "solid-color",
    "ball",
    "smpte100",
    "bar",
    "pinwheel",
    "spokes",
    "gradient",
    "colors",
    "smpte-rp-219",
];

impl SourceUri {
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let uri = uri.trim();
        if uri.is_empty() {
            return Err(UriError::Empty);
        }
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Ok(Self::File { path: uri.into() });
        };
        let invalid = |reason: &str| UriError::Invalid {
            uri: redact(uri),
            reason: reason.to_owned(),
        };
        match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                let path = percent_decode(rest).ok_or_else(|| invalid("bad %-escape"))?;
                if !path.starts_with('/') {
                    return Err(invalid("a file uri needs an absolute path: file:///path"));
                }
                Ok(Self::File { path: path.into() })
            }
            "rtsp" | "rtsps" => Ok(Self::Rtsp {
                address: Address::parse(uri)?,
            }),
            "v4l2" => {
                let (path, query) = split_query(rest);
                if !path.starts_with("/dev/") {
                    return Err(invalid("expected a device path: v4l2:///dev/video0"));
                }
                let mut q = Query::parse(query, &["width", "height", "fps", "format"])
                    .map_err(|r| invalid(&r))?;
                let format = match q.take("format").as_deref() {
                    None => None,
                    Some("mjpg" | "MJPG" | "mjpeg") => Some(CameraFormat::Mjpg),
                    Some("raw" | "RAW" | "yuyv") => Some(CameraFormat::Raw),
                    Some(other) => {
                        return Err(invalid(&format!(
                            "format \"{other}\" must be \"mjpg\" or \"raw\""
                        )));
                    }
                };
                Ok(Self::V4l2 {
                    device: path.into(),
                    width: q.number("width", 1, 16384).map_err(|r| invalid(&r))?,
                    height: q.number("height", 1, 16384).map_err(|r| invalid(&r))?,
                    fps: q.number("fps", 1, 1000).map_err(|r| invalid(&r))?,
                    format,
                })
            }
            "test" => {
                let (pattern, query) = split_query(rest);
                let pattern = pattern.trim_end_matches('/');
                if !PATTERNS.contains(&pattern) {
                    return Err(invalid(&format!(
                        "unknown test pattern \"{pattern}\"; known: {}",
                        PATTERNS.join(", ")
                    )));
                }
                let mut q =
                    Query::parse(query, &["width", "height", "fps", "frames", "live", "pool"])
                        .map_err(|r| invalid(&r))?;
                let live = match q.take("live").as_deref() {
                    None | Some("true" | "1") => true,
                    Some("false" | "0") => false,
                    Some(other) => {
                        return Err(invalid(&format!(
                            "live must be true or false, not \"{other}\""
                        )));
                    }
                };
                Ok(Self::Test(TestPattern {
                    pattern: pattern.to_owned(),
                    width: q
                        .number("width", 16, 16384)
                        .map_err(|r| invalid(&r))?
                        .unwrap_or(640),
                    height: q
                        .number("height", 16, 16384)
                        .map_err(|r| invalid(&r))?
                        .unwrap_or(480),
                    fps: q
                        .number("fps", 1, 1000)
                        .map_err(|r| invalid(&r))?
                        .unwrap_or(30),
                    frames: q
                        .number("frames", 1, u32::MAX)
                        .map_err(|r| invalid(&r))?
                        .map(u64::from),
                    live,
                    pool: q.number("pool", 1, 64).map_err(|r| invalid(&r))?,
                }))
            }
            other => Err(UriError::Scheme(other.to_owned())),
        }
    }

    /// Removes this URI's password, in any spelling, from a text (GStreamer's messages).
    pub fn scrub(&self, text: &str) -> String {
        match self {
            Self::Rtsp { address } => address
                .password()
                .map_or_else(|| text.to_owned(), |p: &Secret| p.scrub(text)),
            _ => text.to_owned(),
        }
    }

    /// Whether the URI carries a user (and maybe a password) itself.
    pub fn has_credentials(&self) -> bool {
        matches!(self, Self::Rtsp { address } if address.has_credentials())
    }

    /// Whether this is a single picture (decoded to one frame) rather than a stream.
    pub fn is_still_image(&self) -> bool {
        let Self::File { path } = self else {
            return false;
        };
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        matches!(
            ext.as_deref(),
            Some("jpg" | "jpeg" | "png" | "bmp" | "webp" | "tif" | "tiff")
        )
    }

    /// Whether frames arrive in real time (a camera, a stream, a paced test pattern).
    pub fn is_live(&self) -> bool {
        match self {
            Self::File { .. } => false,
            Self::Rtsp { .. } | Self::V4l2 { .. } => true,
            Self::Test(t) => t.live,
        }
    }
}

impl fmt::Display for SourceUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The path it opens: a relative one is under the working directory (shown
            // whole, as `file://` needs, rather than `file://in/x.mp4`).
            Self::File { path } => {
                let whole = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                write!(f, "file://{}", whole.display())
            }
            Self::Rtsp { address } => address.fmt(f),
            Self::V4l2 { device, .. } => write!(f, "v4l2://{}", device.display()),
            Self::Test(t) => write!(f, "test://{}", t.pattern),
        }
    }
}

impl fmt::Debug for SourceUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceUri({self})")
    }
}

fn split_query(rest: &str) -> (&str, &str) {
    rest.split_once('?').unwrap_or((rest, ""))
}

/// `key=value&key=value`, restricted to known keys.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str, known: &[&str]) -> Result<Self, String> {
        let mut pairs = Vec::new();
        for part in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            if !known.contains(&k) {
                return Err(format!(
                    "unknown parameter \"{k}\"; known: {}",
                    known.join(", ")
                ));
            }
            pairs.push((k.to_owned(), v.to_owned()));
        }
        Ok(Self(pairs))
    }

    fn take(&mut self, key: &str) -> Option<String> {
        let at = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(at).1)
    }

    fn number(&mut self, key: &str, min: u32, max: u32) -> Result<Option<u32>, String> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        match v.parse::<u32>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "{key} must be a whole number from {min} to {max}, not \"{v}\""
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_path_and_file_uri_are_files() {
        assert_eq!(
            SourceUri::parse("assets/vtest.avi").unwrap(),
            SourceUri::File {
                path: "assets/vtest.avi".into()
            }
        );
        assert_eq!(
            SourceUri::parse("file:///data/my%20clip.mp4").unwrap(),
            SourceUri::File {
                path: "/data/my clip.mp4".into()
            }
        );
    }

    #[test]
    fn a_relative_path_shows_as_the_absolute_path_it_opens() {
        let uri = SourceUri::parse("in/input.mp4").unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            uri.to_string(),
            format!("file://{}", cwd.join("in/input.mp4").display())
        );
        let uri = SourceUri::parse("file:///data/x.mp4").unwrap();
        assert_eq!(uri.to_string(), "file:///data/x.mp4");
    }

    #[test]
    fn test_pattern_defaults_and_parameters() {
        let SourceUri::Test(t) = SourceUri::parse("test://ball").unwrap() else {
            panic!("not a test pattern");
        };
        assert_eq!(
            (t.width, t.height, t.fps, t.frames, t.live),
            (640, 480, 30, None, true)
        );
        let SourceUri::Test(t) =
            SourceUri::parse("test://smpte?width=320&height=240&fps=10&frames=5&live=false")
                .unwrap()
        else {
            panic!("not a test pattern");
        };
        assert_eq!(
            (t.width, t.height, t.fps, t.frames, t.live),
            (320, 240, 10, Some(5), false)
        );
    }

    #[test]
    fn bad_uris_say_why() {
        let e = SourceUri::parse("test://nope").unwrap_err().to_string();
        assert!(e.contains("unknown test pattern \"nope\""), "{e}");
        let e = SourceUri::parse("test://ball?fps=0")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fps must be a whole number from 1 to 1000"),
            "{e}"
        );
        let e = SourceUri::parse("test://ball?colour=red")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown parameter \"colour\""), "{e}");
        let e = SourceUri::parse("ftp://host/x").unwrap_err().to_string();
        assert!(e.contains("unsupported scheme \"ftp\""), "{e}");
        let e = SourceUri::parse("v4l2://video0").unwrap_err().to_string();
        assert!(e.contains("/dev/video0"), "{e}");
    }

    #[test]
    fn passwords_never_show() {
        let uri = SourceUri::parse("rtsp://admin:hunter2@10.0.0.9:554/stream1").unwrap();
        assert_eq!(uri.to_string(), "rtsp://admin:***@10.0.0.9:554/stream1");
        assert!(!format!("{uri:?}").contains("hunter2"));
        let e = SourceUri::parse("rtsp://admin:hunter2@")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(redact("rtsp://cam/x"), "rtsp://cam/x");
        assert_eq!(
            uri.scrub("could not open rtsp://admin:hunter2@10.0.0.9 (hunter2)"),
            "could not open rtsp://admin:***@10.0.0.9 (***)"
        );
        assert_eq!(redact("rtsp://user@cam/x"), "rtsp://user@cam/x");
    }

    #[test]
    fn a_raw_hash_question_mark_or_slash_in_a_password_is_a_config_error_without_it() {
        for password in ["pa#ss", "pa?ss", "pa/ss", "12#ss", "12/ss", "pa%ss"] {
            let uri = format!("rtsp://admin:{password}@127.0.0.1:9/cam");
            let e = SourceUri::parse(&uri).unwrap_err().to_string();
            assert!(
                e.contains("127.0.0.1:9/cam") && e.contains("%23"),
                "{uri}: {e}"
            );
            assert!(!e.contains(password) && !e.contains("ss@"), "{uri}: {e}");
        }
    }

    #[test]
    fn an_encoded_password_is_decoded_for_the_camera_and_shown_as_stars() {
        let uri = SourceUri::parse("rtsp://admin:p%23s%40s@127.0.0.1:9/cam").unwrap();
        let SourceUri::Rtsp { address } = &uri else {
            panic!("not rtsp: {uri:?}");
        };
        assert_eq!(address.password().map(Secret::expose), Some("p#s@s"));
        assert_eq!(
            address.without_credentials().as_str(),
            "rtsp://127.0.0.1:9/cam"
        );
        assert_eq!(uri.to_string(), "rtsp://admin:***@127.0.0.1:9/cam");
        assert!(uri.has_credentials());
        assert_eq!(uri.scrub("p#s@s or p%23s%40s"), "*** or ***");
    }
}
