//! `object_detection`: a YOLO network -> detections of named classes, run by the engine the step
//! names or `auto` picks ([`inference`]: OpenCV's DNN, ONNX Runtime or OpenVINO).
//!
//! The model is a name from `models/models.toml` (by default `yolov3_tiny_coco`, 80 COCO
//! classes, MIT; `yolov12n_coco` is more accurate, under AGPL-3.0) or the user's own
//! (`model_path`, `config_path`, `layout`, `class_names`). Its files are checked and the network
//! is read and run once on the model's check image when the pipeline is loaded, so a missing or
//! corrupt model, an `input_size` it cannot take (a named model's `input_sizes`; for a file of the
//! user's, what its engine says) and outputs that do not fit its layout and class names are
//! `validate` errors, never a failure on every frame. The image is resized to the square input without
//! letterbox (with `keep_aspect`, to an input of its own shape: [`Decoder::input_of`]), scaled
//! to 0..1 with R and B swapped; the outputs are decoded by layout
//! ([`decode`]) and reduced by non-maximum suppression per class. Boxes are in pixels of the
//! image the step was given.
//!
//! With a `when` input (any detections, e.g. a `filter` with `skip_if_empty` after `motion`),
//! the network runs only on frames where that input has a value: motion-gated detection. On
//! the other frames the step ends its branch (skipped, not failed; a `tracker` after it
//! predicts).
//!
//! Threads: a network cannot run two forward passes at once, so the engine keeps one per worker
//! that runs it concurrently, made lazily and reused for every frame.

use std::path::PathBuf;
use std::sync::Arc;

use opencv::core::{self, Mat, MatTraitConst, Rect, Scalar, Size, Vector};
use opencv::dnn;
use serde::Deserialize;
use toml::Spanned;

use super::common::inference::{self, Check, ModelFiles, Network, Request, Tensor, View};
use super::common::models::{self, Sizes};
use super::{DETECTIONS_OUT, Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::{BlobSpec, bgr_blob};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Detection, Image, Value, ValueType};

mod decode;

use decode::{Candidate, Geometry, Layout};

pub(super) static KIND: StepKind = StepKind {
    name: "object_detection",
    summary: "objects of named classes found by a YOLO network (OpenCV DNN, ONNX Runtime or OpenVINO); default model yolov3_tiny_coco (80 COCO classes)",
    inputs: &[
        Port {
            name: "image",
            ty: ValueType::Image,
            optional: false,
        },
        // Optional to leave out; when given, a frame without its value is skipped.
        Port {
            name: "when",
            ty: ValueType::Detections,
            optional: true,
        },
    ],
    outputs: DETECTIONS_OUT,
    params: &[
        ParamDoc {
            name: "model",
            ty: "string",
            default: "\"yolov3_tiny_coco\"",
            doc: "a model of models/models.toml (files in $VIDFLOW_MODELS_DIR, default models/)",
        },
        ParamDoc {
            name: "model_path",
            ty: "path",
            default: "none",
            doc: "instead of model: your own network (.weights with config_path, or .onnx)",
        },
        ParamDoc {
            name: "config_path",
            ty: "path",
            default: "none",
            doc: "the Darknet .cfg of model_path",
        },
        ParamDoc {
            name: "layout",
            ty: "string",
            default: "required with model_path",
            doc: "outputs of model_path: \"darknet\", \"yolov5\", \"yolox\" or \"yolov8\" (ONNX exports)",
        },
        ParamDoc {
            name: "class_names",
            ty: "path",
            default: "required with model_path",
            doc: "file of the class names of model_path, one a line, in output order",
        },
        ParamDoc {
            name: "input_size",
            ty: "integer",
            default: "the model's (yolov3_tiny_coco 416, yolov12n_coco 640)",
            doc: "side of the square network input, a multiple of 32 the model takes (smaller is faster)",
        },
        ParamDoc {
            name: "keep_aspect",
            ty: "bool",
            default: "false",
            doc: "input of the frame's shape: input_size its long side, the other the nearest size the model takes (a 4:3 frame at 640 runs 640x480: a quarter less work)",
        },
        ParamDoc {
            name: "confidence",
            ty: "float in [0, 1]",
            default: "0.4",
            doc: "lowest class score kept",
        },
        ParamDoc {
            name: "nms_iou",
            ty: "float in [0, 1]",
            default: "0.45",
            doc: "boxes of one class overlapping more than this (IoU) are merged",
        },
        ParamDoc {
            name: "classes",
            ty: "list of strings",
            default: "all",
            doc: "class names to report, e.g. [\"person\", \"car\"]",
        },
        inference::BACKEND_DOC,
        inference::PRECISION_DOC,
        inference::THREADS_DOC,
    ],
    stateful: false,
    build,
};

/// The `when` port, in [`KIND`]'s order.
const WHEN: usize = 1;
/// The model used when a step names none.
const DEFAULT_MODEL: &str = "yolov3_tiny_coco";
/// Input side for user models that do not say.
const DEFAULT_INPUT_SIZE: u32 = 416;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    model: Option<Spanned<String>>,
    model_path: Option<Spanned<PathBuf>>,
    config_path: Option<Spanned<PathBuf>>,
    layout: Option<Spanned<String>>,
    class_names: Option<Spanned<PathBuf>>,
    input_size: Option<Spanned<u32>>,
    keep_aspect: Option<Spanned<bool>>,
    confidence: Option<Spanned<f32>>,
    nms_iou: Option<Spanned<f32>>,
    classes: Option<Vec<Spanned<String>>>,
    backend: Option<Spanned<String>>,
    precision: Option<Spanned<inference::PrecisionText>>,
    threads: Option<Spanned<u32>>,
}

/// The network files and how to read them, whichever way they were named.
struct Source {
    /// How messages name the model: `model "yolov3_tiny_coco"`, `model_path "x.onnx"`.
    label: String,
    model: PathBuf,
    config: Option<PathBuf>,
    /// The same network as ONNX, for ONNX Runtime and OpenVINO (a registry model's `onnx`).
    onnx: Option<PathBuf>,
    /// Its quantized copy (a registry model's `onnx_int8`).
    onnx_int8: Option<PathBuf>,
    /// A picture with objects the model finds, for `auto` to judge engines on.
    check_image: Option<PathBuf>,
    /// Frames of a video stacked in one picture, and how many: for `auto` to judge a reduced
    /// precision's tracks on.
    check_clip: Option<(PathBuf, u32)>,
    layout: Layout,
    class_names: Vec<String>,
    input_size: u32,
    input_sizes: Sizes,
}

struct ObjectDetection {
    network: Network,
    /// The table gives a `when` input: run only on frames where it has a value.
    gated: bool,
    decoder: Decoder,
}

/// How an image goes in and the outputs come out: everything but the engine.
struct Decoder {
    layout: Layout,
    class_names: Vec<Arc<str>>,
    wanted: Vec<bool>,
    /// Side of the square input; with `aspect`, the long side of the input.
    input: usize,
    /// `keep_aspect`: the sizes the short side is rounded to; else the input is square.
    aspect: Option<Sizes>,
    confidence: f32,
    nms_iou: f32,
}

impl std::fmt::Debug for ObjectDetection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectDetection")
            .field("layout", &self.decoder.layout)
            .field("input", &self.decoder.input)
            .field("keep_aspect", &self.decoder.aspect.is_some())
            .field("classes", &self.decoder.class_names.len())
            .field("network", &self.network.describe())
            .finish_non_exhaustive()
    }
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let gated = params.has_input("when");
    let c: Config = params.parse()?;
    let confidence = fraction("confidence", c.confidence.as_ref(), 0.4)?;
    let nms_iou = fraction("nms_iou", c.nms_iou.as_ref(), 0.45)?;
    let source = source(&c)?;
    let (input_size, aspect) = input_shape(&c, &source)?;
    let wanted = match &c.classes {
        None => vec![true; source.class_names.len()],
        Some(names) => {
            let mut wanted = vec![false; source.class_names.len()];
            for name in names {
                match source.class_names.iter().position(|n| n == name.get_ref()) {
                    Some(i) => wanted[i] = true,
                    None => {
                        return Err(Diagnostic::at(
                            name.span(),
                            format!(
                                "unknown class \"{}\"{} for {}; its classes: {}",
                                name.get_ref(),
                                crate::spec::did_you_mean(
                                    name.get_ref(),
                                    source.class_names.iter().map(String::as_str)
                                ),
                                source.label,
                                source.class_names.join(", ")
                            ),
                        ));
                    }
                }
            }
            wanted
        }
    };
    let request = Request::parse(c.backend.as_ref(), c.precision.as_ref(), c.threads.as_ref())?;
    let files = ModelFiles {
        label: source.label.clone(),
        darknet: source.config.clone().map(|cfg| (source.model.clone(), cfg)),
        onnx: source
            .onnx
            .clone()
            .or_else(|| (source.config.is_none()).then(|| source.model.clone())),
        onnx_int8: source.onnx_int8.clone(),
        outputs: None,
        opencv_refuses: (source.layout == Layout::Yolov8).then(|| {
            format!(
                "opencv cannot read {}: OpenCV 4.6 reads no network of the yolov8 layout",
                source.onnx.as_ref().unwrap_or(&source.model).display()
            )
        }),
    };
    let decoder = Decoder {
        layout: source.layout,
        class_names: source.class_names.into_iter().map(Arc::from).collect(),
        wanted,
        input: input_size as usize,
        aspect,
        confidence,
        nms_iou,
    };
    let network = {
        let (image, real) = inference::check_image(source.check_image.as_deref());
        let input = |image: &Mat| Ok(decoder.blob(image)?);
        let detections = |image: &Mat, outputs: &[Tensor]| {
            decoder.detections(outputs, image.cols() as f32, image.rows() as f32)
        };
        let fits = |outputs: &[Tensor]| decoder.fits(outputs);
        inference::load(
            &files,
            request,
            &Check {
                image,
                real,
                clip: source.check_clip.clone(),
                input: &input,
                input_name: format!(
                    "input_size {input_size}{}",
                    if aspect.is_some() {
                        " and keep_aspect"
                    } else {
                        ""
                    }
                ),
                detections: &detections,
                fits: &fits,
                settings: format!(
                    "{:?} {} {}",
                    decoder.wanted, decoder.confidence, decoder.nms_iou
                ),
            },
        )
        .map_err(|d| match (&c.backend, d.span.is_none()) {
            (Some(b), true) => Diagnostic::at(b.span(), d.message),
            _ => d,
        })?
    };
    Ok(Box::new(ObjectDetection {
        network,
        gated,
        decoder,
    }))
}

/// The `input_size` the step runs (checked against the model's sizes) and, with `keep_aspect`,
/// the sizes the short side is rounded to (refused for a model of one size).
fn input_shape(c: &Config, source: &Source) -> Result<(u32, Option<Sizes>), Diagnostic> {
    let input_size = match &c.input_size {
        Some(s) if !source.input_sizes.takes(*s.get_ref()) => {
            return Err(Diagnostic::at(
                s.span(),
                format!(
                    "{} cannot take input_size {}; it takes {}",
                    source.label,
                    s.get_ref(),
                    source.input_sizes
                ),
            ));
        }
        Some(s) => *s.get_ref(),
        None => source.input_size,
    };
    let aspect = match &c.keep_aspect {
        Some(k) if *k.get_ref() && source.input_sizes.from >= source.input_sizes.to => {
            return Err(Diagnostic::at(
                k.span(),
                format!(
                    "{} takes only input_size {}: keep_aspect needs a model whose input takes other sizes",
                    source.label, source.input_sizes.from
                ),
            ));
        }
        Some(k) if *k.get_ref() => Some(source.input_sizes),
        Some(_) | None => None,
    };
    Ok((input_size, aspect))
}

fn fraction(key: &str, v: Option<&Spanned<f32>>, default: f32) -> Result<f32, Diagnostic> {
    match v {
        None => Ok(default),
        Some(v) if (0.0..=1.0).contains(v.get_ref()) => Ok(*v.get_ref()),
        Some(v) => Err(Diagnostic::at(
            v.span(),
            format!("{key} must be between 0 and 1, not {}", v.get_ref()),
        )),
    }
}

/// Where the network comes from: a checked model of the registry, or the user's files.
fn source(c: &Config) -> Result<Source, Diagnostic> {
    let Some(model_path) = &c.model_path else {
        for (key, given) in [
            ("config_path", c.config_path.as_ref().map(Spanned::span)),
            ("layout", c.layout.as_ref().map(Spanned::span)),
            ("class_names", c.class_names.as_ref().map(Spanned::span)),
        ] {
            if let Some(span) = given {
                return Err(Diagnostic::at(span, format!("{key} goes with model_path")));
            }
        }
        return registry_source(c.model.as_ref());
    };
    if let Some(model) = &c.model {
        return Err(Diagnostic::at(
            model.span(),
            "give either model or model_path, not both",
        ));
    }
    let label = format!("model_path \"{}\"", model_path.get_ref().display());
    let at =
        |span: std::ops::Range<usize>, what: &str| Diagnostic::at(span, format!("{label}: {what}"));
    let Some(layout) = &c.layout else {
        return Err(at(
            model_path.span(),
            &format!("layout is required ({})", Layout::NAMES),
        ));
    };
    let layout = Layout::parse(layout.get_ref()).ok_or_else(|| {
        at(
            layout.span(),
            &format!(
                "unknown layout \"{}\"; expected {}",
                layout.get_ref(),
                Layout::NAMES
            ),
        )
    })?;
    let Some(names) = &c.class_names else {
        return Err(at(model_path.span(), "class_names is required"));
    };
    let class_names =
        models::read_class_names(names.get_ref()).map_err(|e| at(names.span(), &e))?;
    for file in [Some(model_path), c.config_path.as_ref()]
        .into_iter()
        .flatten()
    {
        if !file.get_ref().is_file() {
            return Err(at(
                file.span(),
                &format!("no file {}", file.get_ref().display()),
            ));
        }
    }
    let darknet = model_path
        .get_ref()
        .extension()
        .is_some_and(|e| e == "weights");
    if darknet && c.config_path.is_none() {
        return Err(at(model_path.span(), "a .weights file needs config_path"));
    }
    Ok(Source {
        label,
        model: model_path.get_ref().clone(),
        config: c.config_path.as_ref().map(|p| p.get_ref().clone()),
        onnx: None,
        onnx_int8: None,
        check_image: None,
        check_clip: None,
        layout,
        class_names,
        input_size: DEFAULT_INPUT_SIZE,
        input_sizes: Sizes::ANY,
    })
}

fn registry_source(model: Option<&Spanned<String>>) -> Result<Source, Diagnostic> {
    let name = model.map_or(DEFAULT_MODEL, |m| m.get_ref().as_str());
    let fail = |message: String| match model {
        Some(m) => Diagnostic::at(m.span(), message),
        None => Diagnostic::new(message),
    };
    let checked = models::checked(name).map_err(|e| fail(e.to_string()))?;
    let label = format!("model \"{name}\"");
    let layout = Layout::parse(&checked.model.layout).ok_or_else(|| {
        fail(format!(
            "{label} has layout \"{}\"; object_detection takes {}",
            checked.model.layout,
            Layout::NAMES
        ))
    })?;
    let model_file = checked
        .file("model")
        .ok_or_else(|| fail(format!("{label} names no model file")))?;
    Ok(Source {
        class_names: checked.class_names(name).map_err(|e| fail(e.to_string()))?,
        model: model_file,
        config: checked.file("config"),
        onnx: checked.file("onnx"),
        onnx_int8: checked.file("onnx_int8"),
        check_image: checked.check_image(),
        check_clip: checked.check_clip(),
        layout,
        input_size: checked.model.input_size.unwrap_or(DEFAULT_INPUT_SIZE),
        input_sizes: checked.input_sizes(),
        label,
    })
}

impl Decoder {
    /// The network's input size (width, height) for an image of `width` x `height`: square, or
    /// with `keep_aspect` of the image's shape, the short side rounded to the nearest size the
    /// model takes (the image is stretched by less than half that step).
    fn input_of(&self, width: f32, height: f32) -> (usize, usize) {
        let Some(sizes) = self.aspect else {
            return (self.input, self.input);
        };
        let step = sizes.multiple.max(1) as usize;
        let scaled = self.input as f32 * width.min(height) / width.max(height).max(1.0);
        // Never above the long side, never below the model's least (nor 0).
        let side = ((scaled / step as f32).round() as usize * step)
            .max(sizes.from as usize)
            .min(self.input)
            .max(step);
        if width >= height {
            (self.input, side)
        } else {
            (side, self.input)
        }
    }

    /// The network's input for an image of `width` x `height`: its size, scale and channel
    /// order the layout wants.
    fn spec(&self, width: f32, height: f32) -> BlobSpec {
        let (w, h) = self.input_of(width, height);
        let side = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        let (scale, rgb) = match self.layout {
            Layout::Darknet | Layout::Yolov5 | Layout::Yolov8 => (1.0 / 255.0, true),
            // YOLOX exports take BGR 0..255.
            Layout::Yolox => (1.0, false),
        };
        BlobSpec {
            width: side(w),
            height: side(h),
            scale,
            rgb,
        }
    }

    /// The network's input for `image`: resized to the input without letterbox, scaled as the
    /// layout wants.
    fn blob(&self, image: &Mat) -> opencv::Result<Mat> {
        let spec = self.spec(image.cols() as f32, image.rows() as f32);
        dnn::blob_from_image(
            image,
            f64::from(spec.scale),
            Size::new(spec.width, spec.height),
            Scalar::default(),
            spec.rgb,
            false,
            core::CV_32F,
        )
    }

    /// Writes the network's input for `image` into `out` (as [`Decoder::blob`] makes it, but
    /// a frame goes from its planes: `frame::BlobSpec`).
    fn fill(&self, image: &Image, out: &mut [f32]) -> Result<(), StepError> {
        let (width, height, _) = image.shape();
        let spec = self.spec(width as f32, height as f32);
        let written = match image {
            Image::Frame(frame) => frame.write_blob(spec, out),
            Image::Luma(_) | Image::Owned(_) => {
                bgr_blob(image.mat().map_err(StepError::Frame)?, spec, out)
            }
        };
        written.map_err(StepError::Frame)
    }

    /// The network's outputs -> detections of the wanted classes, in pixels of an image of
    /// `width` x `height`, after non-maximum suppression.
    fn detections(
        &self,
        outputs: &[Tensor],
        width: f32,
        height: f32,
    ) -> Result<Vec<Detection>, StepError> {
        let outputs: Vec<View<'_>> = outputs.iter().map(View::from).collect();
        self.detections_of(&outputs, width, height)
    }

    /// [`Decoder::detections`] of outputs where the engine keeps them.
    fn detections_of(
        &self,
        outputs: &[View<'_>],
        width: f32,
        height: f32,
    ) -> Result<Vec<Detection>, StepError> {
        let (input_width, input_height) = self.input_of(width, height);
        let geometry = Geometry {
            image_width: width,
            image_height: height,
            input_width,
            input_height,
        };
        let mut candidates = Vec::new();
        for output in outputs {
            decode::decode(
                self.layout,
                &output.shape,
                output.data,
                self.class_names.len(),
                &self.wanted,
                self.confidence,
                geometry,
                &mut candidates,
            )
            .map_err(|e| StepError::Other(e.to_string()))?;
        }
        Ok(suppress(&candidates, self.confidence, self.nms_iou)?
            .into_iter()
            .map(|c| Detection::new(self.class_names[c.class].clone(), c.score, c.bbox))
            .collect())
    }
}

impl Decoder {
    /// Whether the network's outputs have the shapes of the layout for the class names.
    fn fits(&self, outputs: &[Tensor]) -> Result<(), String> {
        if outputs.is_empty() {
            return Err("the network gives no output".to_owned());
        }
        for output in outputs {
            decode::fits(
                self.layout,
                &output.shape,
                output.data.len(),
                self.class_names.len(),
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Step for ObjectDetection {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        if self.gated && input.optional::<[Detection]>(WHEN)?.is_none() {
            return Ok(StepOutput::EndBranch);
        }
        let image = input.get::<Image>(0)?;
        let (width, height, _) = image.shape();
        let (input_width, input_height) = self.decoder.input_of(width as f32, height as f32);
        let mut detections = Vec::new();
        self.network.engine.forward_with(
            [1, 3, input_height, input_width],
            &mut |blob| self.decoder.fill(image, blob),
            &mut |outputs| {
                detections = self
                    .decoder
                    .detections_of(outputs, width as f32, height as f32)?;
                Ok(())
            },
        )?;
        Ok(StepOutput::Values(vec![Value::Detections(
            detections.into(),
        )]))
    }
}

/// Non-maximum suppression per class (OpenCV's `NMSBoxes`), best score first.
fn suppress(
    candidates: &[Candidate],
    confidence: f32,
    nms_iou: f32,
) -> opencv::Result<Vec<Candidate>> {
    let mut classes: Vec<usize> = candidates.iter().map(|c| c.class).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut kept = Vec::new();
    for class in classes {
        let of_class: Vec<&Candidate> = candidates.iter().filter(|c| c.class == class).collect();
        let boxes: Vector<Rect> = of_class
            .iter()
            .map(|c| {
                let b = c.bbox;
                Rect::new(
                    b.x.round() as i32,
                    b.y.round() as i32,
                    b.width.round() as i32,
                    b.height.round() as i32,
                )
            })
            .collect();
        let scores: Vector<f32> = of_class.iter().map(|c| c.score).collect();
        let mut indices = Vector::<i32>::new();
        dnn::nms_boxes_def(&boxes, &scores, confidence, nms_iou, &mut indices)?;
        kept.extend(
            indices
                .iter()
                .filter_map(|i| usize::try_from(i).ok())
                .filter_map(|i| of_class.get(i).copied().copied()),
        );
    }
    kept.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::BBox;

    fn candidate(class: usize, score: f32, x: f32) -> Candidate {
        Candidate {
            class,
            score,
            bbox: BBox {
                x,
                y: 0.0,
                width: 10.0,
                height: 10.0,
            },
        }
    }

    #[test]
    fn suppression_merges_overlaps_of_one_class_only() {
        let kept = suppress(
            &[
                candidate(0, 0.9, 0.0),
                candidate(0, 0.8, 1.0), // overlaps the first (IoU 0.82): merged
                candidate(1, 0.7, 1.0), // same place, other class: kept
                candidate(0, 0.6, 50.0), // elsewhere: kept
            ],
            0.4,
            0.45,
        )
        .unwrap();
        let got: Vec<_> = kept.iter().map(|c| (c.class, c.score)).collect();
        assert_eq!(got, vec![(0, 0.9), (1, 0.7), (0, 0.6)]);
    }

    fn decoder(input: usize, aspect: Option<Sizes>) -> Decoder {
        Decoder {
            layout: Layout::Yolov8,
            class_names: Vec::new(),
            wanted: Vec::new(),
            input,
            aspect,
            confidence: 0.4,
            nms_iou: 0.45,
        }
    }

    #[test]
    fn keep_aspect_gives_the_frames_shape_with_the_short_side_to_the_nearest_size_the_model_takes()
    {
        let square = decoder(640, None);
        assert_eq!(square.input_of(768.0, 576.0), (640, 640));
        let aspect = decoder(640, Some(Sizes::ANY));
        // 4:3 -> 640x480 exactly; 16:9 -> 360, to 352 (nearer than 384); portrait swaps.
        assert_eq!(aspect.input_of(768.0, 576.0), (640, 480));
        assert_eq!(aspect.input_of(1920.0, 1080.0), (640, 352));
        assert_eq!(aspect.input_of(1080.0, 1920.0), (352, 640));
        assert_eq!(aspect.input_of(500.0, 500.0), (640, 640));
        // 320 on a 4:3 frame: 240, to 256 (halfway rounds up); never under the model's least.
        assert_eq!(
            decoder(320, Some(Sizes::ANY)).input_of(768.0, 576.0),
            (320, 256)
        );
        let from_64 = Sizes {
            from: 64,
            to: 1280,
            multiple: 32,
        };
        assert_eq!(
            decoder(320, Some(from_64)).input_of(4000.0, 100.0),
            (320, 64)
        );
        assert_eq!(
            decoder(320, Some(Sizes::ANY)).input_of(4000.0, 1.0),
            (320, 32)
        );
        // The blob is made at that size.
        let spec = aspect.spec(1920.0, 1080.0);
        assert_eq!((spec.width, spec.height), (640, 352));
    }
}
