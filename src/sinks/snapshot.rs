//! `snapshot`: a JPEG of an image (or of a crop around each detection) when something happens.
//!
//! A frame is written when one of the `when` values is non-empty (a line crossing, a filtered
//! detection; of events, one of the kinds `events` names, when it does; without `when`, every
//! frame) and the source's last snapshot is at least
//! `cooldown_s` older, measured in the source's own time (its timestamps when it has them, so a
//! file processed faster than real time is paced like the scene). Files are named by source,
//! frame number and capture time, and never replace an existing file.
//!
//! What a file shows is told to the storage, which links it to events by it (`events::link`):
//! a whole image, each event of its frame; a crop, the track of the frame's `when` events (or
//! tracks) whose box holds most of the crop's ([`object_of`]), or none, so that of two people
//! crossing on one frame each gets the crop of its own.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use opencv::core::{Mat, MatTraitConst, Rect, Vector};
use opencv::imgcodecs;
use serde::Deserialize;
use toml::Spanned;

use super::common::naming::{self, Counter};
use super::common::when::{WHEN_EVENTS_DOC, When};
use super::{Sink, SinkError, SinkFactory, SinkKind, SinkPort};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, Ref, SinkInput};
use crate::storage::{Class, FilePolicy, Retention, Shows, SinkFiles};
use crate::value::{BBox, Detection, Image, Value, ValueType};

pub(super) static KIND: SinkKind = SinkKind {
    name: "snapshot",
    summary: "a JPEG of an image, or a crop around each detection, when a value is non-empty",
    inputs: &[
        super::IMAGE_PORT,
        super::WHEN_PORT,
        SinkPort {
            name: "crops",
            ty: Some(ValueType::Detections),
            list: true,
            optional_with: None,
        },
    ],
    params: &[
        ParamDoc {
            name: "dir",
            ty: "path",
            default: "required",
            doc: "folder of the JPEG files (created); SOURCE-FRAME-TIME.jpg, never overwritten",
        },
        ParamDoc {
            name: "cooldown_s",
            ty: "float >= 0",
            default: "10.0",
            doc: "least time between two snapshots of one source, in the source's time",
        },
        ParamDoc {
            name: "quality",
            ty: "integer in [1, 100]",
            default: "90",
            doc: "JPEG quality, 1..100",
        },
        ParamDoc {
            name: "padding",
            ty: "float in [0, 10]",
            default: "0.1",
            doc: "with crops: share of a box's size added on each side",
        },
        WHEN_EVENTS_DOC,
        super::RETAIN_DAYS_DOC,
        super::MAX_GB_DOC,
    ],
    build,
};

const DEFAULT_COOLDOWN_S: f64 = 10.0;
const DEFAULT_QUALITY: i32 = 90;
const DEFAULT_PADDING: f32 = 0.1;
/// The least share of a crop's box inside a track's box for the crop to show that track: a
/// detection and its track's box are one box (or nearly, smoothed); a face within a person's
/// box is inside it whole; a passer-by's box overlapping another's is mostly outside it.
const MIN_SHARE_INSIDE: f32 = 0.5;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    dir: PathBuf,
    cooldown_s: Option<Spanned<f64>>,
    quality: Option<Spanned<i32>>,
    padding: Option<Spanned<f32>>,
    events: Option<Spanned<Vec<Spanned<String>>>>,
    retain_days: Option<Spanned<f64>>,
    max_gb: Option<Spanned<f64>>,
}

#[derive(Debug)]
struct Factory {
    dir: PathBuf,
    cooldown: Duration,
    quality: i32,
    padding: f32,
    events: Option<Vec<crate::value::EventKind>>,
    policy: FilePolicy,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let cooldown = match c.cooldown_s {
        None => Duration::from_secs_f64(DEFAULT_COOLDOWN_S),
        Some(s) => Duration::try_from_secs_f64(*s.get_ref()).map_err(|_| {
            Diagnostic::at(
                s.span(),
                format!("cooldown_s must be 0 or more seconds, not {}", s.get_ref()),
            )
        })?,
    };
    let quality = match c.quality {
        None => DEFAULT_QUALITY,
        Some(q) if (1..=100).contains(q.get_ref()) => *q.get_ref(),
        Some(q) => {
            return Err(Diagnostic::at(
                q.span(),
                format!("quality must be between 1 and 100, not {}", q.get_ref()),
            ));
        }
    };
    let padding = match c.padding {
        None => DEFAULT_PADDING,
        Some(p) if (0.0..=10.0).contains(p.get_ref()) => *p.get_ref(),
        Some(p) => {
            return Err(Diagnostic::at(
                p.span(),
                format!("padding must be between 0 and 10, not {}", p.get_ref()),
            ));
        }
    };
    Ok(Box::new(Factory {
        dir: c.dir,
        cooldown,
        quality,
        padding,
        events: When::parse_events(c.events)?,
        policy: FilePolicy {
            class: Class::Event,
            retention: Retention::parse(c.retain_days, c.max_gb, None)?,
            expected_file: 0,
        },
    }))
}

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| SinkError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let of = |port: &str| -> Vec<Ref> {
            inputs
                .iter()
                .filter(|i| i.port == port)
                .map(|i| i.from)
                .collect()
        };
        let image = of("image").first().copied().ok_or_else(|| {
            SinkError::Other("snapshot: no image input (the config layer requires one)".into())
        })?;
        Ok(Box::new(Snapshot {
            dir: self.dir.clone(),
            cooldown: self.cooldown,
            params: Vector::from_slice(&[imgcodecs::IMWRITE_JPEG_QUALITY, self.quality]),
            padding: self.padding,
            image,
            when: When::new(inputs, self.events.clone()),
            crops: of("crops"),
            last: HashMap::new(),
            files: storage.sink(name, self.policy),
        }))
    }
}

struct Snapshot {
    dir: PathBuf,
    cooldown: Duration,
    /// imencode's parameters: the JPEG quality.
    params: Vector<i32>,
    padding: f32,
    image: Ref,
    when: When,
    crops: Vec<Ref>,
    /// Per source, the time of its last snapshot (see [`source_time`]).
    last: HashMap<Arc<str>, Duration>,
    files: SinkFiles,
}

/// Writes `bytes` to a new file at `path`, or at `path` with `-1`, `-2`... before its extension
/// when that name is taken: an existing file is never replaced. The file is indexed in `files`
/// once made (so a name taken by someone else is never claimed), as made for frame `seq` of
/// `source`, showing `shows` of it; on a full disk the storage purges by its policies and the
/// write is tried once more, else the empty file is removed.
fn write_new(
    path: &Path,
    bytes: &[u8],
    files: &SinkFiles,
    (source, seq, shows): (&str, u64, Shows),
) -> Result<PathBuf, SinkError> {
    let (mut file, candidate) = naming::create_new(path, Counter::Dash)?;
    let io = |source| SinkError::Io {
        path: candidate.clone(),
        source,
    };
    let writing = files.create(&candidate, source).map_err(io)?;
    writing.made_for(seq, shows);
    let mut written = file.write_all(bytes);
    if let Err(e) = &written
        && crate::storage::is_full(e)
        && files.disk_full(&candidate) > 0
    {
        written = file
            .set_len(0)
            .and_then(|()| file.seek(std::io::SeekFrom::Start(0)))
            .and_then(|_| file.write_all(bytes));
    }
    match written {
        Ok(()) => {
            files.wrote();
            Ok(candidate.clone())
        }
        Err(e) if crate::storage::is_full(&e) => {
            let _ = file.set_len(0);
            writing.discard_if_empty();
            Err(SinkError::DiskFull { path: candidate })
        }
        Err(e) => Err(io(e)),
    }
}

/// The track among `objects` (track ids and their boxes) that a crop of `crop` shows: the one
/// whose box holds the largest share of it, at least [`MIN_SHARE_INSIDE`], the closest in
/// size (IoU) among those holding it alike; `None` when no box holds enough of it.
fn object_of(crop: &BBox, objects: &[(u64, BBox)]) -> Option<u64> {
    let area = crop.width * crop.height;
    if area <= 0.0 {
        return None;
    }
    let inside = |b: &BBox| {
        let w = (crop.x + crop.width).min(b.x + b.width) - crop.x.max(b.x);
        let h = (crop.y + crop.height).min(b.y + b.height) - crop.y.max(b.y);
        w.max(0.0) * h.max(0.0) / area
    };
    objects
        .iter()
        .map(|(track, b)| (inside(b), crop.iou(b), *track))
        .filter(|(share, ..)| *share >= MIN_SHARE_INSIDE)
        .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)))
        .map(|(.., track)| track)
}

/// `bbox` grown by `padding` of its size on each side, clipped to a `width` x `height` image.
fn padded(d: &Detection, padding: f32, width: i32, height: i32) -> Option<Rect> {
    let b = d.bbox;
    let (px, py) = (b.width * padding, b.height * padding);
    let x0 = ((b.x - px).floor() as i32).clamp(0, width);
    let y0 = ((b.y - py).floor() as i32).clamp(0, height);
    let x1 = ((b.x + b.width + px).ceil() as i32).clamp(0, width);
    let y1 = ((b.y + b.height + py).ceil() as i32).clamp(0, height);
    (x1 > x0 && y1 > y0).then(|| Rect::new(x0, y0, x1 - x0, y1 - y0))
}

impl Snapshot {
    fn encode(&self, mat: &impl opencv::core::ToInputArray) -> Result<Vector<u8>, SinkError> {
        let mut buf = Vector::new();
        imgcodecs::imencode(".jpg", mat, &mut buf, &self.params)
            .map_err(|e| SinkError::Other(format!("jpeg: {e}")))?;
        Ok(buf)
    }
}

impl Sink for Snapshot {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let triggered = !self.when.given() || self.when.triggered(result);
        let now = super::source_time(result);
        let frame = result.frame();
        let cooling = self
            .last
            .get(&frame.source)
            .is_some_and(|&last| now.saturating_sub(last) < self.cooldown && now >= last);
        if !triggered || cooling {
            return Ok(false);
        }
        let Some(Value::Image(image)) = result.value(self.image) else {
            return Ok(false);
        };
        let mat: &Mat = Image::mat(&image).map_err(|e| SinkError::Other(e.to_string()))?;
        let name = format!(
            "{}-{:06}-{}",
            frame.source,
            frame.seq,
            super::compact_time(frame.captured)
        );
        let mut written = 0;
        if self.crops.is_empty() {
            write_new(
                &self.dir.join(format!("{name}.jpg")),
                self.encode(mat)?.as_slice(),
                &self.files,
                (&frame.source, frame.seq, Shows::Frame),
            )?;
            written += 1;
        } else {
            let objects = self.when.objects(result);
            let detections: Vec<Detection> = self
                .crops
                .iter()
                .filter_map(|&r| result.value(r))
                .filter_map(|v| v.get::<[Detection]>().map(<[Detection]>::to_vec))
                .flatten()
                .collect();
            for (i, d) in detections.iter().enumerate() {
                let Some(rect) = padded(d, self.padding, mat.cols(), mat.rows()) else {
                    continue;
                };
                let crop = Mat::roi(mat, rect).map_err(|e| SinkError::Other(e.to_string()))?;
                let class: String = d
                    .class
                    .chars()
                    .map(|c| if c.is_alphanumeric() { c } else { '_' })
                    .collect();
                write_new(
                    &self.dir.join(format!("{name}-{i}-{class}.jpg")),
                    self.encode(&crop)?.as_slice(),
                    &self.files,
                    (
                        &frame.source,
                        frame.seq,
                        Shows::Object(object_of(&d.bbox, &objects)),
                    ),
                )?;
                written += 1;
            }
        }
        if written == 0 {
            return Ok(false);
        }
        self.last.insert(frame.source.clone(), now);
        Ok(true)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::BBox;

    #[test]
    fn a_taken_name_gets_a_counter_and_the_old_file_is_kept_and_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let storage = crate::storage::Storage::start(
            crate::storage::StorageConfig::default(),
            Arc::new(crate::storage::SystemClock),
        )
        .unwrap();
        let policy = FilePolicy {
            class: Class::Event,
            retention: Retention::default(),
            expected_file: 0,
        };
        let files = storage.sink("snap", policy);
        let path = dir.path().join("cam-000001-x.jpg");
        std::fs::write(&path, b"a user's").unwrap();
        let first = write_new(&path, b"first", &files, ("cam", 1, Shows::Frame)).unwrap();
        let second = write_new(&path, b"second", &files, ("cam", 1, Shows::Frame)).unwrap();
        assert_eq!(first, dir.path().join("cam-000001-x-1.jpg"));
        assert_eq!(second, dir.path().join("cam-000001-x-2.jpg"));
        assert_eq!(std::fs::read(&path).unwrap(), b"a user's");
        assert_eq!(std::fs::read(&second).unwrap(), b"second");
        let index = std::fs::read_to_string(dir.path().join(crate::storage::index::INDEX)).unwrap();
        assert!(!index.contains("\"cam-000001-x.jpg\""), "{index}");
        assert!(index.contains("\"cam-000001-x-2.jpg\""), "{index}");
        storage.stop();
    }

    #[test]
    fn crops_are_padded_and_clipped_to_the_image() {
        let d = Detection::new(
            "face".into(),
            1.0,
            BBox {
                x: 5.0,
                y: 10.0,
                width: 20.0,
                height: 10.0,
            },
        );
        assert_eq!(padded(&d, 0.5, 100, 100), Some(Rect::new(0, 5, 35, 20)));
        assert_eq!(padded(&d, 0.0, 100, 12), Some(Rect::new(5, 10, 20, 2)));
        assert_eq!(padded(&d, 0.0, 3, 100), None);
    }

    fn bbox(x: f32, y: f32, width: f32, height: f32) -> BBox {
        BBox {
            x,
            y,
            width,
            height,
        }
    }

    #[test]
    fn a_crop_shows_the_track_whose_box_holds_it_and_no_track_it_only_touches() {
        let person = |x| bbox(x, 0.0, 40.0, 100.0);
        let objects = [(1, person(0.0)), (2, person(30.0))];
        // A detection of track 2, overlapping track 1's box a quarter: track 2.
        assert_eq!(object_of(&bbox(30.0, 0.0, 40.0, 100.0), &objects), Some(2));
        // Its track's box smoothed a little off it: still track 2.
        assert_eq!(object_of(&bbox(33.0, 2.0, 40.0, 100.0), &objects), Some(2));
        // A face inside track 1's box only: track 1.
        assert_eq!(object_of(&bbox(5.0, 5.0, 15.0, 15.0), &objects), Some(1));
        // A passer-by a quarter inside track 2's box, or beside both: none.
        assert_eq!(object_of(&bbox(100.0, 0.0, 40.0, 100.0), &objects), None);
        assert_eq!(object_of(&bbox(60.0, 0.0, 40.0, 100.0), &objects), None);
        assert_eq!(object_of(&bbox(0.0, 0.0, 40.0, 100.0), &[]), None);
        // Of two boxes holding it whole, the one of its size: a child before a grown-up.
        let nested = [
            (1, bbox(0.0, 0.0, 100.0, 200.0)),
            (2, bbox(10.0, 10.0, 20.0, 40.0)),
        ];
        assert_eq!(object_of(&bbox(10.0, 12.0, 20.0, 38.0), &nested), Some(2));
        assert_eq!(object_of(&bbox(0.0, 0.0, 0.0, 0.0), &nested), None);
    }

    #[test]
    fn times_in_names_have_no_colons() {
        let t = std::time::UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        let s = super::super::compact_time(t);
        assert!(!s.contains(':') && !s.contains('-'), "{s}");
        assert!(s.ends_with(".123Z"), "{s}");
    }
}
