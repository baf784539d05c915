//! `filter`: keeps the detections that match; can end the branch when none is left.

use std::sync::Arc;

use serde::Deserialize;

use super::common::geometry::{ANCHOR_DOC, Anchor, Polygon, RawPoints};
use super::{Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Value, ValueType};

const DETECTIONS: &[Port] = &[Port {
    name: "detections",
    ty: ValueType::Detections,
    optional: false,
}];

pub(super) static KIND: StepKind = StepKind {
    name: "filter",
    summary: "keep detections by class, confidence, area and zone; optionally end the branch when none is left",
    inputs: DETECTIONS,
    outputs: DETECTIONS,
    params: &[
        ParamDoc {
            name: "classes",
            ty: "list of strings",
            default: "all",
            doc: "classes to keep",
        },
        ParamDoc {
            name: "min_confidence",
            ty: "float",
            default: "0.0",
            doc: "lowest confidence kept",
        },
        ParamDoc {
            name: "min_area",
            ty: "float",
            default: "0.0",
            doc: "smallest box kept, in square pixels",
        },
        ParamDoc {
            name: "zone",
            ty: "[[x, y], ...]",
            default: "none",
            doc: "a polygon (at least 3 points); keep detections whose anchor is inside",
        },
        ANCHOR_DOC,
        ParamDoc {
            name: "skip_if_empty",
            ty: "bool",
            default: "false",
            doc: "when nothing is kept, skip the steps that read this one for this frame",
        },
    ],
    stateful: false,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    classes: Option<Vec<String>>,
    min_confidence: Option<f32>,
    min_area: Option<f32>,
    skip_if_empty: Option<bool>,
    zone: Option<RawPoints>,
    anchor: Option<Anchor>,
}

#[derive(Debug)]
struct Filter {
    classes: Option<Vec<Arc<str>>>,
    min_confidence: f32,
    min_area: f32,
    skip_if_empty: bool,
    zone: Option<Polygon>,
    anchor: Anchor,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let zone = match &c.zone {
        Some(raw) => Some(Polygon::parse(raw, "zone")?),
        None => None,
    };
    Ok(Box::new(Filter {
        classes: c.classes.map(|cs| cs.into_iter().map(Arc::from).collect()),
        min_confidence: c.min_confidence.unwrap_or(0.0),
        min_area: c.min_area.unwrap_or(0.0),
        skip_if_empty: c.skip_if_empty.unwrap_or(false),
        zone,
        anchor: c.anchor.unwrap_or_default(),
    }))
}

impl Step for Filter {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let kept: Vec<_> = input
            .detections(0)?
            .iter()
            .filter(|d| {
                d.confidence >= self.min_confidence
                    && d.bbox.width * d.bbox.height >= self.min_area
                    && self.classes.as_ref().is_none_or(|cs| cs.contains(&d.class))
                    && self
                        .zone
                        .as_ref()
                        .is_none_or(|z| z.contains(self.anchor.of(&d.bbox)))
            })
            .cloned()
            .collect();
        if kept.is_empty() && self.skip_if_empty {
            return Ok(StepOutput::EndBranch);
        }
        Ok(StepOutput::Values(vec![Value::Detections(kept.into())]))
    }
}

#[cfg(test)]
mod tests {
    use opencv::core::Mat;

    use super::*;
    use crate::frame::Frame;
    use crate::value::{BBox, Detection};

    /// Detections whose bottom centres are at each of `points`, through a filter of `params`.
    fn kept(params: &str, points: &[[f32; 2]]) -> Vec<[f32; 2]> {
        let step = build(Params::from_toml(params)).unwrap();
        let detections: Vec<Detection> = points
            .iter()
            .map(|&[x, y]| {
                let bbox = BBox {
                    x: x - 4.0,
                    y: y - 10.0,
                    width: 8.0,
                    height: 10.0,
                };
                Detection::new("person".into(), 0.9, bbox)
            })
            .collect();
        let frame = Frame::from_mat("cam".into(), 0, None, Mat::default());
        let values = [Some(Value::Detections(detections.into()))];
        let out = step
            .run(&StepInput {
                frame: &frame,
                values: &values,
            })
            .unwrap();
        let StepOutput::Values(out) = out else {
            panic!("ended the branch")
        };
        let kept = out[0].get::<[crate::value::Detection]>().unwrap();
        kept.iter().map(|d| d.bbox.anchor()).collect()
    }

    #[test]
    fn a_zone_keeps_the_detections_whose_anchor_is_inside() {
        // A triangle: (0, 0), (100, 0), (0, 100).
        let zone = "zone = [[0, 0], [100, 0], [0, 100]]";
        let points = [[10.0, 10.0], [60.0, 60.0], [40.0, 50.0], [-5.0, 5.0]];
        assert_eq!(kept(zone, &points), vec![[10.0, 10.0], [40.0, 50.0]]);
        // The box centre (5 px above the bottom) can be inside when the bottom is not.
        let centre = format!("{zone}\nanchor = \"center\"");
        assert_eq!(
            kept(&centre, &[[50.0, 53.0], [50.0, 56.0]]),
            vec![[50.0, 53.0]]
        );
        assert_eq!(kept(zone, &[[50.0, 53.0]]), Vec::<[f32; 2]>::new());
        assert_eq!(kept("", &points).len(), 4);
    }

    #[test]
    fn a_zone_of_two_points_is_refused_where_it_is_written() {
        let text = "zone = [[0, 0], [100, 0]]";
        let err = build(Params::from_toml(text)).unwrap_err();
        assert_eq!(err.span, Some(7..25));
        assert!(err.message.contains("at least 3 points"), "{err:?}");
    }
}
