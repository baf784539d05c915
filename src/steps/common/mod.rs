//! What step kinds share and no user names: the geometry of zones and lines, a step's engine
//! instances, the named models, per-source state, the memory of lost tracks the counters share
//! and the network steps' inference engines.
//! Kept apart from the kinds so that `ls src/steps` lists the kinds a pipeline file can name.

pub(super) mod geometry;
pub(super) mod inference;
pub(super) mod instances;
pub(super) mod models;
pub(super) mod per_source;
pub(super) mod reid;
