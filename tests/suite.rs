//! The integration tests, one binary: each `tests/NAME.rs` is a module of it, and
//! `tests/common/` the helpers they share. One binary links the library, OpenCV and GStreamer
//! once where one per file linked them 60 times (2 GB of test executables, and minutes of
//! linking); cargo-nextest still runs each test in a process of its own. A file not named here
//! is never compiled: `tests/architecture.rs` checks every file is.
//!
//! One file's tests: `cargo nextest run --test suite 'clip::'` (or `cargo test --test suite
//! clip::`).

mod common;

mod api;
mod api_media;
mod api_spec;
mod api_zones;
mod architecture;
mod backends;
mod bad_input;
mod cli;
mod clip;
mod config_validation;
mod counting;
mod decoder_pool;
mod demo_engines;
mod docs;
mod durability;
mod end_to_end;
mod events;
mod executor;
mod executor_failures;
mod executor_sources;
mod failures;
mod final_counts;
mod http;
mod http_access;
mod http_fds;
mod http_starvation;
mod live;
mod logging;
mod messages;
mod models;
mod motion_gate;
mod mqtt;
mod nats;
mod notify;
mod outputs;
mod page;
mod page_cameras;
mod page_health;
mod page_proxy;
mod page_video;
mod passwords;
mod preview;
mod progress;
mod record;
mod redaction;
mod redis_stream;
mod reload;
mod retention;
mod rtcp;
mod rtsp_hostile;
mod rtsp_server;
mod rtsp_source;
mod runtimes;
mod shutdown;
mod signals;
mod size_change;
mod snapshot;
mod speed;
mod stop;
mod systemd;
mod tracking;
mod video;
mod video_encoded;
mod video_sizes;
mod vision;
mod webhook;
