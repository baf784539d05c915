//! vidflow: live video analytics.
//!
//! ```text
//! sources (GStreamer: file / rtsp / v4l2 / test pattern; each supervised, reconnecting)
//!   -> decode -> frames as decoded (I420/NV12, zero-copy; BGR made on first use)
//!   -> a bounded queue per source (live: drop oldest; file: wait)
//!   -> workflow::Executor: the step DAG of each frame on one persistent workflow::Pool,
//!      up to max_in_flight frames at once, results back in each source's frame order
//!   -> sinks (jsonl, video_file), each on its own thread behind a bounded queue
//! ```
//!
//! A pipeline file ([`config`]) is parsed and checked once, compiled into a
//! [`workflow::Graph`], and run by [`daemon::run`], which also owns the shutdown order.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod events;
pub mod frame;
pub mod gst_setup;
pub mod outcome;
pub mod packets;
pub mod sinks;
pub mod source;
pub mod spec;
pub mod steps;
pub mod storage;
pub mod throttle;
pub mod value;
pub mod workflow;
