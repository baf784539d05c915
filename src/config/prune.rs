//! Steps nothing observes.
//!
//! A run observes a step's outputs through its sinks (every reference a sink reads, `include`
//! and `when` alike) and through its final counts (every `counts` output, reported at the end
//! and in the stats, whether or not a sink reads it). A step is needed when a run observes it or
//! a needed step reads it. The daemon names the others at start and `validate` after `ok`; it
//! still runs them, since a step's failures, hangs and panics are the run's whether or not a
//! sink reads it (they are counted, and `on_step_error` applies). [`Pipeline::prune_unread`]
//! takes them out, for a library user who wants that.

use super::Name;
use super::resolve::Pipeline;
use crate::spec::Ref;
use crate::value::ValueType;

impl Pipeline {
    /// For each step, in order: whether a run needs it.
    pub fn needed_steps(&self) -> Vec<bool> {
        let mut needed: Vec<bool> = self
            .steps
            .iter()
            .map(|s| s.kind.outputs.iter().any(|o| o.ty == ValueType::Counts))
            .collect();
        for input in self.sinks.iter().flat_map(|s| &s.inputs) {
            if let Ref::Step { step, .. } = input.from {
                needed[step] = true;
            }
        }
        // Steps come after those they read, so one pass from the last carries the need back.
        for i in (0..self.steps.len()).rev() {
            if !needed[i] {
                continue;
            }
            for r in self.steps[i].inputs.iter().flatten() {
                if let Ref::Step { step, .. } = *r {
                    needed[step] = true;
                }
            }
        }
        needed
    }

    /// Takes out the steps no run observes (see the module) and returns their names, in order.
    /// The references of the steps and sinks left are renumbered.
    pub fn prune_unread(&mut self) -> Vec<Name> {
        let needed = self.needed_steps();
        if needed.iter().all(|n| *n) {
            return Vec::new();
        }
        let mut position = vec![None; needed.len()];
        let mut next = 0;
        for (i, keep) in needed.iter().enumerate() {
            if *keep {
                position[i] = Some(next);
                next += 1;
            }
        }
        // A needed step reads only needed steps, and every sink reference is needed.
        let renumber = |r: &mut Ref| {
            if let Ref::Step { step, .. } = r
                && let Some(new) = position[*step]
            {
                *step = new;
            }
        };
        let mut pruned = Vec::new();
        let steps = std::mem::take(&mut self.steps);
        for (step, keep) in steps.into_iter().zip(needed) {
            if keep {
                self.steps.push(step);
            } else {
                pruned.push(step.name);
            }
        }
        for r in self
            .steps
            .iter_mut()
            .flat_map(|s| s.inputs.iter_mut().flatten())
        {
            renumber(r);
        }
        for input in self.sinks.iter_mut().flat_map(|s| s.inputs.iter_mut()) {
            renumber(&mut input.from);
        }
        pruned
    }
}

/// The line a run logs and `validate` prints about steps nothing reads: `steps whose output no
/// sink reads (...), run for nothing on every frame: "overlay", "grey"`.
pub fn pruned_message(pruned: &[Name]) -> String {
    let names: Vec<String> = pruned.iter().map(|n| format!("\"{n}\"")).collect();
    format!(
        "{} whose output no sink reads (nor a step a sink reads, nor the final counts), run \
         for nothing on every frame: {}",
        if pruned.len() == 1 { "step" } else { "steps" },
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use crate::config::{Pipeline, SourceText, load_text};
    use crate::spec::Ref;

    fn pipeline(steps_and_sinks: &str) -> Pipeline {
        let text = format!("[sources.cam]\nuri = \"test://ball\"\n{steps_and_sinks}");
        load_text(&SourceText::new("p.toml", text)).unwrap()
    }

    fn names(p: &Pipeline) -> Vec<&str> {
        p.steps.iter().map(|s| &*s.name).collect()
    }

    const CHAIN: &str = r#"
[steps.small]
kind = "resize"
image = "$frame"
width = 64
height = 48

[steps.grey]
kind = "grayscale"
image = "$steps.small.image"

[steps.moving]
kind = "motion"
image = "$steps.small.image"

[steps.drawn]
kind = "annotate"
image = "$steps.small.image"
detections = "$steps.moving.detections"
"#;

    #[test]
    fn steps_no_sink_reads_are_taken_out_and_references_renumbered() {
        let mut p = pipeline(&format!(
            "{CHAIN}\n[sinks.out]\nkind = \"jsonl\"\npath = \"/dev/null\"\ninclude = [\"$steps.grey.image\"]\n"
        ));
        assert_eq!(names(&p), ["small", "grey", "moving", "drawn"]);
        let pruned = p.prune_unread();
        // `moving` is stateful: unread, it goes too.
        assert_eq!(
            pruned.iter().map(|n| &**n).collect::<Vec<_>>(),
            ["moving", "drawn"]
        );
        assert_eq!(names(&p), ["small", "grey"]);
        assert_eq!(p.steps[1].inputs, [Some(Ref::Step { step: 0, output: 0 })]);
        assert_eq!(p.sinks[0].inputs[0].from, Ref::Step { step: 1, output: 0 });
    }

    #[test]
    fn what_a_sink_reads_and_every_step_before_it_runs() {
        let mut p = pipeline(&format!(
            "{CHAIN}\n[sinks.out]\nkind = \"jsonl\"\npath = \"/dev/null\"\ninclude = [\"$steps.drawn.image\"]\n"
        ));
        let pruned = p.prune_unread();
        assert_eq!(pruned.iter().map(|n| &**n).collect::<Vec<_>>(), ["grey"]);
        assert_eq!(names(&p), ["small", "moving", "drawn"]);
        assert_eq!(
            p.steps[2].inputs,
            [
                Some(Ref::Step { step: 0, output: 0 }),
                Some(Ref::Step { step: 1, output: 0 }),
                None,
                None,
            ]
        );
    }

    #[test]
    fn a_step_with_counts_runs_without_a_sink_and_so_do_its_inputs() {
        let mut p = pipeline(&format!(
            "{CHAIN}\n[steps.tracks]\nkind = \"tracker\"\ndetections = \"$steps.moving.detections\"\n\n[steps.line]\nkind = \"line_counter\"\ntracks = \"$steps.tracks.tracks\"\nline = [[10, 0], [10, 48]]\n"
        ));
        let pruned = p.prune_unread();
        assert_eq!(
            pruned.iter().map(|n| &**n).collect::<Vec<_>>(),
            ["grey", "drawn"]
        );
        assert_eq!(names(&p), ["small", "moving", "tracks", "line"]);
    }

    #[test]
    fn a_pipeline_whose_steps_are_all_read_is_left_as_it_is() {
        let mut p = pipeline(&format!(
            "{CHAIN}\n[sinks.out]\nkind = \"jsonl\"\npath = \"/dev/null\"\ninclude = [\"$steps.grey.image\", \"$steps.drawn.image\"]\n"
        ));
        assert!(p.prune_unread().is_empty());
        assert_eq!(names(&p), ["small", "grey", "moving", "drawn"]);
    }
}
