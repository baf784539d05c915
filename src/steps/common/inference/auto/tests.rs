use opencv::core::Mat;

use super::*;
use crate::steps::StepError;
use crate::value::Detection;

fn tensor(data: &[f32]) -> Tensor {
    Tensor {
        shape: vec![data.len()],
        data: data.to_vec(),
    }
}

/// An engine that gives the same outputs whatever its input: what a runtime gives, scripted.
#[derive(Debug)]
struct Scripted(Vec<f32>);

impl Engine for Scripted {
    fn forward(&self, _: &Mat) -> Result<Vec<Tensor>, StepError> {
        Ok(vec![tensor(&self.0)])
    }
}

fn trial(backend: Backend, precision: Precision, ms: f64, outputs: &[f32]) -> Trial {
    Trial {
        backend,
        precision,
        engine: Box::new(Scripted(outputs.to_vec())),
        ms,
        outputs: vec![tensor(outputs)],
    }
}

/// Judged with no precision asked for: see [`judged_for`].
fn judged(
    trials: &[Trial],
    frames: usize,
    clip: &mut dyn FnMut(usize) -> Result<Vec<Vec<Track>>, String>,
) -> Vec<Result<Option<String>, String>> {
    judged_for(None, trials, frames, clip)
}

/// Judged for a request of precision `only`, on a check where each output value is the x of a
/// 10x10 box (so outputs are boxes), with a clip of `frames` frames.
fn judged_for(
    only: Option<Precisions>,
    trials: &[Trial],
    frames: usize,
    clip: &mut dyn FnMut(usize) -> Result<Vec<Vec<Track>>, String>,
) -> Vec<Result<Option<String>, String>> {
    let input = |_: &Mat| Ok(Mat::default());
    let detections = |_: &Mat, outputs: &[Tensor]| {
        Ok(outputs[0]
            .data
            .iter()
            .map(|&x| {
                Detection::new(
                    "person".into(),
                    0.9,
                    BBox {
                        x,
                        y: 0.0,
                        width: 10.0,
                        height: 10.0,
                    },
                )
            })
            .collect())
    };
    let fits = |_: &[Tensor]| Ok(());
    let check = Check {
        image: Mat::default(),
        real: true,
        clip: (frames > 0).then(|| (std::path::PathBuf::from("clip.png"), frames as u32)),
        input: &input,
        input_name: "input_size 64".to_owned(),
        detections: &detections,
        fits: &fits,
        settings: String::new(),
    };
    judge(trials, only, &check, clip).unwrap()
}

fn tracks(ids: &[u64]) -> Vec<Vec<Track>> {
    (0..20)
        .map(|_| {
            ids.iter()
                .map(|&id| Track {
                    track_id: id,
                    detection: Detection::new(
                        "person".into(),
                        0.9,
                        BBox {
                            x: id as f32 * 100.0,
                            y: 0.0,
                            width: 10.0,
                            height: 10.0,
                        },
                    ),
                    predicted: false,
                    ground: None,
                    speed: None,
                    dwell: None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn auto_takes_the_most_precise_of_the_nearly_fastest() {
    use Precision::*;
    assert_eq!(pick(&[], None), None);
    // bf16 clearly faster than f32: bf16.
    assert_eq!(
        pick(&[(F32, 25.0), (F32, 26.0), (Bf16, 6.0), (Int8, 7.5)], None),
        Some(2)
    );
    // int8 within 15% of bf16: bf16, the more precise.
    assert_eq!(pick(&[(Bf16, 6.0), (Int8, 5.5)], None), Some(0));
    // int8 clearly faster: int8.
    assert_eq!(pick(&[(Bf16, 6.0), (Int8, 4.0)], None), Some(1));
    // f32 engines within 15%: the faster of them.
    assert_eq!(
        pick(&[(F32, 27.0), (F32, 25.0), (Bf16, 26.0)], None),
        Some(1)
    );
}

/// `[bf16, f32]`, `[int8, f32]`...
fn list(precisions: &[Precision]) -> Option<Precisions> {
    let names = precisions.iter().map(|p| p.name().to_owned()).collect();
    Some(super::super::parse_precisions(None, &super::super::PrecisionText(names)).unwrap())
}

#[test]
fn asked_for_a_list_auto_takes_its_first_precision_that_agrees_however_fast_the_rest() {
    use Precision::*;
    // bf16 first: bf16, though f32 and int8 are faster.
    let times = [(F32, 5.0), (Int8, 4.0), (Bf16, 30.0), (Bf16, 20.0)];
    assert_eq!(pick(&times, list(&[Bf16, F32])), Some(3));
    // No bf16 agreed here: the fastest f32.
    assert_eq!(pick(&[(F32, 9.0), (F32, 7.0)], list(&[Bf16, F32])), Some(1));
    // f32 first: an f32, though bf16 is four times as fast.
    assert_eq!(
        pick(&[(Bf16, 5.0), (F32, 20.0)], list(&[F32, Bf16])),
        Some(1)
    );
    assert_eq!(pick(&[], list(&[Bf16, F32])), None);
}

#[test]
fn in_a_list_a_precision_after_one_that_agrees_is_not_run_on_the_clip() {
    let trials = [
        trial(Backend::OpenVino, Precision::F32, 20.0, &[0.0, 100.0]),
        trial(Backend::OpenVino, Precision::Bf16, 30.0, &[0.0, 100.0]),
        trial(Backend::OnnxRuntime, Precision::Int8, 5.0, &[0.0, 100.0]),
    ];
    let mut runs = Vec::new();
    let verdicts = judged_for(
        list(&[Precision::Bf16, Precision::Int8]),
        &trials,
        20,
        &mut |i| {
            runs.push(i);
            Ok(tracks(&[1, 2]))
        },
    );
    // bf16 is judged on the clip however slow; int8, after it, is never taken.
    assert!(matches!(verdicts[1], Ok(Some(_))), "{verdicts:?}");
    assert!(
        verdicts[2]
            .as_ref()
            .unwrap_err()
            .contains("openvino bf16 agrees and comes first"),
        "{verdicts:?}"
    );
    // bf16, then f32 for the reference tracks; never int8.
    assert_eq!(runs, [1, 0]);
}

#[test]
fn an_engine_that_gives_nan_is_never_taken() {
    // Its outputs are refused when it is timed...
    let e = measure(
        Backend::OpenVino,
        Precision::F32,
        Box::new(Scripted(vec![0.0, f32::NAN])),
        &Mat::default(),
    )
    .err()
    .unwrap();
    assert!(e.contains("not numbers"), "{e}");
    // ...and, were they not, would agree with nothing.
    let trials = [
        trial(Backend::OpenCv, Precision::F32, 30.0, &[f32::NAN, 50.0]),
        trial(Backend::OnnxRuntime, Precision::F32, 20.0, &[0.0, 50.0]),
        trial(Backend::OpenVino, Precision::F32, 10.0, &[0.0, f32::NAN]),
        trial(Backend::OpenVino, Precision::Bf16, 5.0, &[f32::NAN, 50.0]),
    ];
    let verdicts = judged(&trials, 20, &mut |_| Ok(tracks(&[1, 2])));
    // Not the reference either: the first f32 engine whose outputs are numbers is.
    for i in [0, 2, 3] {
        let e = verdicts[i].as_ref().unwrap_err();
        assert!(e.contains("not numbers"), "{i}: {verdicts:?}");
    }
    assert_eq!(verdicts[1], Ok(None));
}

#[test]
fn a_reduced_precision_must_keep_f32s_tracks_on_the_clip() {
    let trials = [
        trial(Backend::OnnxRuntime, Precision::F32, 30.0, &[0.0, 100.0]),
        trial(Backend::OpenVino, Precision::F32, 20.0, &[0.0, 100.0]),
        trial(Backend::OpenVino, Precision::Bf16, 5.0, &[1.0, 100.0]),
        trial(Backend::OnnxRuntime, Precision::Int8, 9.0, &[0.0, 101.0]),
        trial(Backend::OpenVino, Precision::Int8, 6.0, &[0.0, 300.0]),
    ];
    let mut runs = Vec::new();
    // Every engine finds the same two boxes on the image but for openvino int8; on the clip,
    // bf16 gives one more track, onnxruntime int8 follows them as f32 does.
    let verdicts = judged(&trials, 20, &mut |i| {
        runs.push(i);
        Ok(match i {
            2 => tracks(&[1, 2, 3]),
            _ => tracks(&[1, 2]),
        })
    });
    assert_eq!(verdicts[0], Ok(None));
    assert_eq!(verdicts[1], Ok(None));
    let e = verdicts[2].as_ref().unwrap_err();
    assert!(e.contains("3 tracks against f32's 2"), "{e}");
    let int8 = verdicts[3].as_ref().unwrap().as_ref().unwrap();
    assert_eq!(
        int8,
        "2 tracks against f32's 2 and IDF1 1.000 on the check clip"
    );
    let e = verdicts[4].as_ref().unwrap_err();
    assert!(e.contains("finds 50% of f32's 2 boxes"), "{e}");
    // bf16 first, then the reference tracks from the fastest f32 engine, once; openvino int8,
    // which disagreed on the image, is not run on the clip.
    assert_eq!(runs, [2, 1, 3]);
    // Without a clip, no reduced precision is taken.
    let verdicts = judged(&trials, 0, &mut |_| Ok(tracks(&[1, 2])));
    assert!(verdicts[2].as_ref().unwrap_err().contains("no check clip"));
}

#[test]
fn a_reduced_precision_never_taken_here_is_not_run_on_the_clip() {
    // bf16 agrees at 5 ms: onnxruntime int8 at 9 ms would never be taken, openvino int8 at 4 ms
    // could be. An int8 slower than an f32 engine that agrees is never taken either.
    let trials = [
        trial(Backend::OpenVino, Precision::F32, 20.0, &[0.0, 100.0]),
        trial(Backend::OpenVino, Precision::Bf16, 5.0, &[0.0, 100.0]),
        trial(Backend::OnnxRuntime, Precision::Int8, 9.0, &[0.0, 100.0]),
        trial(Backend::OpenVino, Precision::Int8, 4.0, &[0.0, 100.0]),
    ];
    let mut runs = Vec::new();
    let verdicts = judged(&trials, 20, &mut |i| {
        runs.push(i);
        Ok(tracks(&[1, 2]))
    });
    assert!(matches!(verdicts[1], Ok(Some(_))));
    let e = verdicts[2].as_ref().unwrap_err();
    assert_eq!(
        e,
        "not judged on the clip: never taken here, openvino bf16 agrees and is as fast"
    );
    assert!(matches!(verdicts[3], Ok(Some(_))));
    assert_eq!(runs, [1, 0, 3]);
    let slow = [
        trial(Backend::OpenVino, Precision::F32, 20.0, &[0.0, 100.0]),
        trial(Backend::OnnxRuntime, Precision::Int8, 25.0, &[0.0, 100.0]),
    ];
    let verdicts = judged(&slow, 20, &mut |_| panic!("not run on the clip"));
    assert!(
        verdicts[1]
            .as_ref()
            .unwrap_err()
            .contains("openvino f32 agrees")
    );
    // Asked for int8, neither f32 nor bf16 can be taken: every int8 that agrees on the image is
    // run on the clip, however fast the others are.
    let mut runs = Vec::new();
    let verdicts = judged_for(
        Some(Precisions::one(Precision::Int8)),
        &trials,
        20,
        &mut |i| {
            runs.push(i);
            Ok(tracks(&[1, 2]))
        },
    );
    assert!(matches!(verdicts[2], Ok(Some(_))), "{verdicts:?}");
    assert!(matches!(verdicts[3], Ok(Some(_))), "{verdicts:?}");
    let verdicts = judged_for(
        Some(Precisions::one(Precision::Int8)),
        &slow,
        20,
        &mut |_| Ok(tracks(&[1, 2])),
    );
    assert!(matches!(verdicts[1], Ok(Some(_))), "{verdicts:?}");
}

#[test]
fn asked_for_a_reduced_precision_auto_still_runs_the_f32_references() {
    let dir = std::path::PathBuf::from("models");
    let files = super::super::ModelFiles {
        label: "model \"m\"".to_owned(),
        darknet: None,
        onnx: Some(dir.join("m.onnx")),
        onnx_int8: Some(dir.join("m-int8.onnx")),
        outputs: None,
        opencv_refuses: None,
    };
    let files = Files {
        opencv: &files,
        others: &files,
    };
    let request = |precision| Request {
        backend: None,
        precision,
        threads: 1,
    };
    let bf16 = candidates(files, request(Some(Precisions::one(Precision::Bf16))));
    assert_eq!(
        bf16,
        [
            (Backend::OpenCv, Precision::F32),
            (Backend::OnnxRuntime, Precision::F32),
            (Backend::OpenVino, Precision::F32),
            (Backend::OpenVino, Precision::Bf16),
        ]
    );
    let int8 = candidates(files, request(Some(Precisions::one(Precision::Int8))));
    assert_eq!(int8.len(), 5);
    assert!(int8[..3].iter().all(|c| c.1 == Precision::F32));
    let f32 = candidates(files, request(Some(Precisions::one(Precision::F32))));
    assert!(f32.iter().all(|c| c.1 == Precision::F32));
    assert_eq!(candidates(files, request(None)).len(), 6);
}
