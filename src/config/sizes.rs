//! Image sizes known before the run: a sink that records the images of a `crop` or `resize`
//! says what it will do with their size (`video_file` pads odd sizes: a note) or that it
//! cannot record them (a problem, exit 78), at `validate` rather than at the first frame.

use std::ops::Range;

use crate::sinks::SinkFactory;
use crate::spec::{Diagnostic, Ref, SinkInput};

/// Checks the `image` inputs of one sink (`inputs`, with the span of each reference) against
/// the sizes steps fix in advance (`sizes`, by step index as the references number them).
pub(super) fn check_sink(
    what: &str,
    factory: &dyn SinkFactory,
    inputs: &[(SinkInput, Range<usize>)],
    sizes: &[Option<(u32, u32)>],
    diags: &mut Vec<Diagnostic>,
    notes: &mut Vec<Diagnostic>,
) {
    for (input, span) in inputs.iter().filter(|(i, _)| i.port == "image") {
        let Ref::Step { step, .. } = input.from else {
            continue;
        };
        let Some((width, height)) = sizes.get(step).copied().flatten() else {
            continue;
        };
        let said_of = |message: String| {
            Diagnostic::at(
                span.clone(),
                format!("{what}: \"${}\": {message}", input.label),
            )
        };
        match factory.images_of(width, height) {
            Ok(Some(note)) => notes.push(said_of(note)),
            Ok(None) => {}
            Err(problem) => diags.push(said_of(problem)),
        }
    }
}
