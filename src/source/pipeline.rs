//! Source URI -> GStreamer pipeline description.
//!
//! Descriptions never contain a location: the element named `src` gets its `location` (a path,
//! or an RTSP URL that may carry credentials) as a property after parsing, so a description can
//! be logged or shown by `vidflow graph` safely, and no quoting of paths is needed.

use super::uri::{CameraFormat, SourceUri};

/// Name of the element whose `location`/`device` property receives the URI.
pub(crate) const SOURCE_ELEMENT: &str = "src";
/// Name of the appsink that hands BGR frames to vidflow.
pub(crate) const APPSINK: &str = "frames";

/// The part of every description after decoding: BGR conversion on all cores, then the appsink.
fn tail(threads: usize) -> String {
    format!(
        "videoconvert n-threads={threads} ! video/x-raw,format=BGR ! \
         appsink name={APPSINK} sync=false max-buffers=1 enable-last-sample=false"
    )
}

/// The gst-launch description for a source.
pub fn describe(uri: &SourceUri, convert_threads: usize) -> String {
    let tail = tail(convert_threads);
    match uri {
        SourceUri::File { .. } => {
            format!("filesrc name={SOURCE_ELEMENT} ! decodebin ! {tail}")
        }
        SourceUri::Rtsp { .. } => {
            format!("rtspsrc name={SOURCE_ELEMENT} latency=200 ! decodebin ! {tail}")
        }
        SourceUri::V4l2 {
            width,
            height,
            fps,
            format,
            ..
        } => {
            let mut caps = match format {
                Some(CameraFormat::Mjpg) => "image/jpeg".to_owned(),
                Some(CameraFormat::Raw) => "video/x-raw".to_owned(),
                None => String::new(),
            };
            let fields = [
                width.map(|w| format!("width={w}")),
                height.map(|h| format!("height={h}")),
                fps.map(|f| format!("framerate={f}/1")),
            ];
            for field in fields.into_iter().flatten() {
                if caps.is_empty() {
                    caps.push_str("video/x-raw");
                }
                caps.push(',');
                caps.push_str(&field);
            }
            let caps = if caps.is_empty() {
                String::new()
            } else {
                format!("{caps} ! ")
            };
            format!("v4l2src name={SOURCE_ELEMENT} ! {caps}decodebin ! {tail}")
        }
        SourceUri::Test(t) => {
            let buffers = t
                .frames
                .map(|n| format!(" num-buffers={n}"))
                .unwrap_or_default();
            format!(
                "videotestsrc name={SOURCE_ELEMENT} pattern={} is-live={}{buffers} ! \
                 video/x-raw,width={},height={},framerate={}/1 ! {tail}",
                t.pattern, t.live, t.width, t.height, t.fps
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camera_with_mjpeg_caps_decodes_before_conversion() {
        let uri = SourceUri::parse("v4l2:///dev/video2?width=1280&height=720&fps=30&format=mjpg")
            .unwrap();
        assert_eq!(
            describe(&uri, 2),
            "v4l2src name=src ! image/jpeg,width=1280,height=720,framerate=30/1 ! decodebin ! \
             videoconvert n-threads=2 ! video/x-raw,format=BGR ! appsink name=frames sync=false \
             max-buffers=1 enable-last-sample=false"
        );
    }

    #[test]
    fn camera_without_caps_lets_gstreamer_negotiate() {
        let uri = SourceUri::parse("v4l2:///dev/video0").unwrap();
        assert!(describe(&uri, 1).starts_with("v4l2src name=src ! decodebin ! videoconvert"));
        let uri = SourceUri::parse("v4l2:///dev/video0?width=640").unwrap();
        assert!(describe(&uri, 1).starts_with("v4l2src name=src ! video/x-raw,width=640 ! "));
    }

    #[test]
    fn rtsp_description_never_holds_the_url() {
        let uri = SourceUri::parse("rtsp://u:secret@cam/stream").unwrap();
        let d = describe(&uri, 2);
        assert!(d.starts_with("rtspsrc name=src"));
        assert!(!d.contains("secret") && !d.contains("cam/stream"));
    }

    #[test]
    fn every_description_parses_in_gstreamer() {
        gstreamer::init().unwrap();
        for uri in [
            "test://ball?frames=3&live=false",
            "/tmp/x.mp4",
            "rtsp://cam/x",
            "v4l2:///dev/video0?format=raw&width=320&height=240",
        ] {
            let d = describe(&SourceUri::parse(uri).unwrap(), 2);
            gstreamer::parse::launch(&d).unwrap_or_else(|e| panic!("{uri}: {d}: {e}"));
        }
    }
}
