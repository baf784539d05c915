//! The models a detector can name: `models/models.toml`, embedded in the binary, and the checks
//! that a model's files are present and intact, made when a pipeline is loaded (so `validate`
//! reports a missing or corrupt model, never the first frame).
//!
//! Model files are looked up in the directory named by `VIDFLOW_MODELS_DIR`, else `models`
//! (relative to the working directory, like every path of a pipeline file). Each file is hashed
//! once per process: the result is cached by path, size and modification time, so several steps
//! naming one model, or `validate` then `run`, do not read 35 MB twice.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The registry, as committed in `models/models.toml`.
const MODELS_TOML: &str = include_str!("../../../models/models.toml");

/// The command that puts the registry's files in place, quoted by every error about them.
pub(in crate::steps) const FETCH_COMMAND: &str = "scripts/fetch-assets (or make setup)";

/// Environment variable naming the directory that holds the model files.
pub(in crate::steps) const MODELS_DIR_VAR: &str = "VIDFLOW_MODELS_DIR";

/// One entry of `models.toml`: what the detectors use of it. Its other keys (`source`,
/// `licence`, `output`) document the model for people; a unit test checks they are there.
#[derive(Debug, Deserialize)]
pub(in crate::steps) struct Model {
    /// How the step decodes the outputs: `darknet`, `yolov5`, `yolox`, `yolov8`, `yunet`.
    pub(in crate::steps) layout: String,
    /// The default square input size, in pixels (none: the image's own size).
    pub(in crate::steps) input_size: Option<u32>,
    /// The input sizes the network can take (none: [`Sizes::ANY`]).
    pub(in crate::steps) input_sizes: Option<Sizes>,
    /// A file of class names, one a line (in the models directory).
    pub(in crate::steps) class_names: Option<String>,
    /// The class names themselves, for a model with few.
    pub(in crate::steps) classes: Option<Vec<String>>,
    /// A picture with objects the model finds (in the models directory), on which `backend =
    /// "auto"` judges the engines. An input, not a trust anchor: it has no sha256, and without
    /// it `auto` judges f32 engines on a synthetic picture and takes no reduced precision.
    pub(in crate::steps) check_image: Option<String>,
    /// Consecutive frames of a video stacked top to bottom in one picture (in the models
    /// directory), on which `auto` runs the tracker over f32's and a reduced precision's
    /// detections: a reduced precision is taken only where both give the same tracks. An input,
    /// like the check image: without it no reduced precision is taken.
    pub(in crate::steps) check_clip: Option<ClipFile>,
    /// Role (`model`, `config`, `onnx`) -> file name in the models directory.
    pub(in crate::steps) files: BTreeMap<String, String>,
    /// File name -> sha256 (every file the entry names).
    pub(in crate::steps) sha256: BTreeMap<String, String>,
}

/// The square input sizes a network can take: multiples of `multiple` from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::steps) struct Sizes {
    pub(in crate::steps) from: u32,
    pub(in crate::steps) to: u32,
    pub(in crate::steps) multiple: u32,
}

impl Sizes {
    /// What a network without `input_sizes` may be given (a YOLO's largest stride is 32).
    pub(in crate::steps) const ANY: Self = Self {
        from: 32,
        to: 4096,
        multiple: 32,
    };

    /// Whether `side` is one of them.
    pub(in crate::steps) fn takes(self, side: u32) -> bool {
        (self.from..=self.to).contains(&side) && side.is_multiple_of(self.multiple.max(1))
    }
}

impl std::fmt::Display for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "multiples of {} from {} to {}",
            self.multiple, self.from, self.to
        )
    }
}

/// `check_clip`: the picture and how many frames it stacks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::steps) struct ClipFile {
    pub(in crate::steps) file: String,
    pub(in crate::steps) frames: u32,
}

/// Why a model cannot be used.
#[derive(Debug, thiserror::Error)]
pub(in crate::steps) enum ModelError {
    #[error("unknown model \"{0}\"{1}; known models: {2}")]
    Unknown(String, String, String),
    #[error("model \"{model}\": {} is missing; fetch it with {FETCH_COMMAND}", .path.display())]
    Missing { model: String, path: PathBuf },
    #[error(
        "model \"{model}\": {} is corrupt (sha256 {found}, expected {expected}); fetch it again with {FETCH_COMMAND}",
        .path.display()
    )]
    Checksum {
        model: String,
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("model \"{model}\": cannot read {}: {source}", .path.display())]
    Io {
        model: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("model \"{model}\": {what}")]
    Entry { model: String, what: String },
}

fn registry() -> &'static BTreeMap<String, Model> {
    static REGISTRY: OnceLock<BTreeMap<String, Model>> = OnceLock::new();
    // The file is part of the source tree: a unit test parses it, so this cannot fail in a
    // build whose tests passed; a broken edit would show as no models at all.
    REGISTRY.get_or_init(|| toml::from_str(MODELS_TOML).unwrap_or_default())
}

/// The directory holding model files.
pub(in crate::steps) fn models_dir() -> PathBuf {
    std::env::var_os(MODELS_DIR_VAR).map_or_else(|| PathBuf::from("models"), PathBuf::from)
}

/// The roles of files a model runs without: the int8 copy, which only `precision = "int8"`
/// needs (scripts/fetch-assets does not keep one that is not the pinned bytes). Present, it is
/// checked like the others.
const OPTIONAL_ROLES: [&str; 1] = ["onnx_int8"];

/// A model of the registry whose files are all present with their recorded sha256 (an optional
/// one may be missing).
#[derive(Debug)]
pub(in crate::steps) struct Checked {
    pub(in crate::steps) model: &'static Model,
    pub(in crate::steps) dir: PathBuf,
}

impl Checked {
    /// The model's check image, if it names one and the file is there.
    pub(in crate::steps) fn check_image(&self) -> Option<PathBuf> {
        self.model
            .check_image
            .as_ref()
            .map(|f| self.dir.join(f))
            .filter(|p| p.is_file())
    }

    /// The model's check clip, if it names one and the file is there: its path and how many
    /// frames it stacks.
    pub(in crate::steps) fn check_clip(&self) -> Option<(PathBuf, u32)> {
        self.model
            .check_clip
            .as_ref()
            .map(|c| (self.dir.join(&c.file), c.frames))
            .filter(|(p, _)| p.is_file())
    }

    /// The input sizes the model takes.
    pub(in crate::steps) fn input_sizes(&self) -> Sizes {
        self.model.input_sizes.unwrap_or(Sizes::ANY)
    }

    /// The path of the file with this role (`model`, `config`, `onnx`, `onnx_int8`); `None`
    /// where the model has none, or where an optional one is not there.
    pub(in crate::steps) fn file(&self, role: &str) -> Option<PathBuf> {
        self.model
            .files
            .get(role)
            .map(|f| self.dir.join(f))
            .filter(|p| !OPTIONAL_ROLES.contains(&role) || p.is_file())
    }

    /// The model's class names, in output order.
    pub(in crate::steps) fn class_names(&self, name: &str) -> Result<Vec<String>, ModelError> {
        match (&self.model.classes, &self.model.class_names) {
            (Some(classes), _) => Ok(classes.clone()),
            (None, Some(file)) => {
                read_class_names(&self.dir.join(file)).map_err(|e| ModelError::Entry {
                    model: name.to_owned(),
                    what: e,
                })
            }
            (None, None) => Err(ModelError::Entry {
                model: name.to_owned(),
                what: "names no classes".to_owned(),
            }),
        }
    }
}

/// Looks `name` up and checks every file it names against its sha256.
pub(in crate::steps) fn checked(name: &str) -> Result<Checked, ModelError> {
    checked_in(name, models_dir())
}

/// [`checked`], in the directory `dir`.
fn checked_in(name: &str, dir: PathBuf) -> Result<Checked, ModelError> {
    let model = registry().get(name).ok_or_else(|| {
        let known: Vec<_> = registry().keys().map(|k| format!("\"{k}\"")).collect();
        let nearest = crate::spec::did_you_mean(name, registry().keys().map(String::as_str));
        ModelError::Unknown(name.to_owned(), nearest, known.join(", "))
    })?;
    let optional: Vec<&String> = OPTIONAL_ROLES
        .iter()
        .filter_map(|role| model.files.get(*role))
        .collect();
    for (file, expected) in &model.sha256 {
        let path = dir.join(file);
        if optional.contains(&file) && !path.exists() {
            continue;
        }
        let found = sha256_of(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => ModelError::Missing {
                model: name.to_owned(),
                path: path.clone(),
            },
            _ => ModelError::Io {
                model: name.to_owned(),
                path: path.clone(),
                source,
            },
        })?;
        if !found.eq_ignore_ascii_case(expected) {
            return Err(ModelError::Checksum {
                model: name.to_owned(),
                path,
                found,
                expected: expected.clone(),
            });
        }
    }
    Ok(Checked { model, dir })
}

/// Reads a file of class names, one a line (blank lines ignored).
pub(in crate::steps) fn read_class_names(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read class names {}: {e}", path.display()))?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Err(format!("class names {} is empty", path.display()));
    }
    Ok(names)
}

/// What identifies one version of a file on disk, for the hash cache.
type FileKey = (PathBuf, u64, Option<SystemTime>);

/// The sha256 of a file, hashed at most once per version of it in this process.
fn sha256_of(path: &Path) -> std::io::Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<FileKey, String>>> = OnceLock::new();
    let meta = std::fs::metadata(path)?;
    let key = (path.to_owned(), meta.len(), meta.modified().ok());
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(sum) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(sum.clone());
    }
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let sum: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, sum.clone());
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_parses_and_every_file_has_a_sum() {
        let models: BTreeMap<String, Model> = toml::from_str(MODELS_TOML).unwrap();
        assert!(models.contains_key("yolov3_tiny_coco") && models.contains_key("yunet_face"));
        for (name, m) in &models {
            for file in m.files.values().chain(&m.class_names) {
                assert!(m.sha256.contains_key(file), "{name}: {file} has no sha256");
            }
            assert!(m.class_names.is_some() || m.classes.is_some(), "{name}");
        }
        let raw: toml::Table = toml::from_str(MODELS_TOML).unwrap();
        for (name, entry) in &raw {
            for key in ["source", "licence", "output"] {
                assert!(entry.get(key).is_some(), "{name} has no {key}");
            }
        }
    }

    /// COCO 2017's 80 detection categories, in the order of their ids (1 to 90 with gaps), as
    /// the dataset's annotations name them.
    const COCO: [&str; 80] = [
        "person",
        "bicycle",
        "car",
        "motorcycle",
        "airplane",
        "bus",
        "train",
        "truck",
        "boat",
        "traffic light",
        "fire hydrant",
        "stop sign",
        "parking meter",
        "bench",
        "bird",
        "cat",
        "dog",
        "horse",
        "sheep",
        "cow",
        "elephant",
        "bear",
        "zebra",
        "giraffe",
        "backpack",
        "umbrella",
        "handbag",
        "tie",
        "suitcase",
        "frisbee",
        "skis",
        "snowboard",
        "sports ball",
        "kite",
        "baseball bat",
        "baseball glove",
        "skateboard",
        "surfboard",
        "tennis racket",
        "bottle",
        "wine glass",
        "cup",
        "fork",
        "knife",
        "spoon",
        "bowl",
        "banana",
        "apple",
        "sandwich",
        "orange",
        "broccoli",
        "carrot",
        "hot dog",
        "pizza",
        "donut",
        "cake",
        "chair",
        "couch",
        "potted plant",
        "bed",
        "dining table",
        "toilet",
        "tv",
        "laptop",
        "mouse",
        "remote",
        "keyboard",
        "cell phone",
        "microwave",
        "oven",
        "toaster",
        "sink",
        "refrigerator",
        "book",
        "clock",
        "vase",
        "scissors",
        "teddy bear",
        "hair drier",
        "toothbrush",
    ];

    /// The `names` of an Ultralytics ONNX export's metadata (`{0: 'person', 1: 'bicycle',
    /// ...}`, a Python dict's text), read from the file's bytes.
    fn metadata_names(onnx: &[u8]) -> Vec<String> {
        let text = String::from_utf8_lossy(onnx);
        let start = text.find("{0: '").expect("no names in the metadata");
        let end = start + text[start..].find('}').unwrap();
        text[start + 1..end]
            .split(", ")
            .enumerate()
            .map(|(i, entry)| {
                let (index, name) = entry.split_once(": ").unwrap();
                assert_eq!(index, i.to_string(), "{entry}");
                name.trim_matches('\'').to_owned()
            })
            .collect()
    }

    #[test]
    fn yolov12n_coco_names_the_80_coco_classes_in_its_own_order() {
        let models: BTreeMap<String, Model> = toml::from_str(MODELS_TOML).unwrap();
        let model = &models["yolov12n_coco"];
        let classes = model.classes.as_ref().unwrap();
        assert_eq!(classes, &COCO);
        // The export's own metadata, in the file models.toml names: the same list.
        let file = models_dir().join(&model.files["onnx"]);
        let onnx = std::fs::read(&file).expect("run scripts/fetch-assets");
        assert_eq!(&metadata_names(&onnx), classes);
    }

    #[test]
    fn a_model_runs_without_its_int8_copy_but_never_with_an_altered_one() {
        let model = &registry()["yolov3_tiny_coco"];
        let int8 = &model.files["onnx_int8"];
        let dir = tempfile::tempdir().unwrap();
        for file in model.sha256.keys().filter(|f| *f != int8) {
            std::os::unix::fs::symlink(
                models_dir().join(file).canonicalize().unwrap(),
                dir.path().join(file),
            )
            .unwrap();
        }
        // No int8 copy (fetch-assets did not keep one): the model checks, without int8.
        let checked = checked_in("yolov3_tiny_coco", dir.path().to_owned()).unwrap();
        assert_eq!(checked.file("onnx_int8"), None);
        assert!(checked.file("onnx").unwrap().is_file());
        // A required file missing is still an error.
        let onnx = dir.path().join(&model.files["onnx"]);
        std::fs::rename(&onnx, dir.path().join("aside")).unwrap();
        let e = checked_in("yolov3_tiny_coco", dir.path().to_owned()).unwrap_err();
        assert!(matches!(e, ModelError::Missing { .. }), "{e}");
        std::fs::rename(dir.path().join("aside"), &onnx).unwrap();
        // An int8 copy that is there is checked like the rest.
        std::fs::write(dir.path().join(int8), b"not the pinned bytes").unwrap();
        let e = checked_in("yolov3_tiny_coco", dir.path().to_owned()).unwrap_err();
        assert!(matches!(e, ModelError::Checksum { .. }), "{e}");
    }

    /// sha256sum (coreutils) of `path`: an implementation independent of this module's.
    fn coreutils_sum(path: &Path) -> String {
        let out = std::process::Command::new("sha256sum")
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    }

    #[test]
    fn a_file_is_hashed_whole_and_again_when_it_changes_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights");
        // Several read buffers and a partial last one.
        let mut bytes: Vec<u8> = (0..200_003u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let first = sha256_of(&path).unwrap();
        assert_eq!(first, coreutils_sum(&path));
        // The same size, one byte changed in the last buffer, a later modification time: a
        // cached sum must not hide it.
        bytes[199_999] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let second = sha256_of(&path).unwrap();
        assert_ne!(second, first);
        assert_eq!(second, coreutils_sum(&path));
    }

    #[test]
    fn input_sizes_take_multiples_within_their_bounds() {
        let sizes = Sizes {
            from: 64,
            to: 1280,
            multiple: 32,
        };
        assert!(sizes.takes(64) && sizes.takes(416) && sizes.takes(1280));
        assert!(!sizes.takes(32) && !sizes.takes(400) && !sizes.takes(1312));
        assert_eq!(sizes.to_string(), "multiples of 32 from 64 to 1280");
        assert!(Sizes::ANY.takes(4096) && !Sizes::ANY.takes(4128));
    }
}
