//! The keys of the tables this layer reads itself (a source, `[executor]`, `[daemon]`,
//! `[storage]`, `[http]`) and the keys every step or sink takes besides its kind's own: what
//! `vidflow sources`, `steps` and `sinks` print (and `--markdown`, docs/reference/).
//!
//! A type written `T in RANGE` (or `T >= N`) gives the range validation accepts; the keys are
//! those of the `Raw*` tables in `raw.rs`, which `tests/docs.rs` checks against.

use crate::spec::ParamDoc;

/// One table of a pipeline file: its header, what it is for, and its keys.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    pub header: &'static str,
    pub summary: &'static str,
    pub keys: &'static [ParamDoc],
}

/// `[sources.NAME]` and `[sources.NAME.reconnect]`.
pub static SOURCE_TABLES: &[Table] = &[
    Table {
        header: "[sources.NAME]",
        summary: "a video source: a file, an RTSP camera, a V4L2 camera or a test pattern; \
                  several feed one workflow, each with its own decoder, queue and counters",
        keys: &[
            ParamDoc {
                name: "uri",
                ty: "string",
                default: "required",
                doc: "a path or file:///abs/path, rtsp://host[:port]/path, v4l2:///dev/videoN, \
                      or test://PATTERN?width=W&height=H&fps=F&frames=N&live=BOOL&pool=N",
            },
            ParamDoc {
                name: "record_uri",
                ty: "string",
                default: "uri's stream",
                doc: "the stream a `record` sink writes as sent (never decoded): an rtsp:// \
                      URL or a file, e.g. the camera's main stream while uri is its sub-stream",
            },
            ParamDoc {
                name: "user",
                ty: "string",
                default: "none",
                doc: "RTSP login (rtsp sources only)",
            },
            ParamDoc {
                name: "password",
                ty: "string",
                default: "none",
                doc: "RTSP password, as it is (not percent-encoded); \"${VARIABLE}\" reads it \
                      from the environment; never printed",
            },
            ParamDoc {
                name: "password_file",
                ty: "path",
                default: "none",
                doc: "instead of password: a file holding it; relative to \
                      $CREDENTIALS_DIRECTORY when systemd sets it (LoadCredential=)",
            },
            ParamDoc {
                name: "transport",
                ty: "\"tcp\" | \"udp\" | \"auto\"",
                default: "\"tcp\"",
                doc: "RTSP transport (rtsp sources only)",
            },
            ParamDoc {
                name: "latency_ms",
                ty: "integer",
                default: "200",
                doc: "RTSP jitter buffer (rtsp sources only)",
            },
            ParamDoc {
                name: "queue",
                ty: "integer in [1, 64]",
                default: "2 (live), 4 (file)",
                doc: "decoded frames waiting for the workflow; a live source drops its oldest \
                      when full, a file waits",
            },
            ParamDoc {
                name: "max_fps",
                ty: "integer in [1, 1000]",
                default: "no limit",
                doc: "frames beyond this rate are dropped before any conversion (counted as \
                      throttled)",
            },
            ParamDoc {
                name: "stall_timeout_ms",
                ty: "integer >= 100",
                default: "5000",
                doc: "no frame for this long: the stream is torn down and reconnected",
            },
            ParamDoc {
                name: "max_frame_pixels",
                ty: "integer in [1, 4294836225]",
                default: "40000000",
                doc: "frames larger than this are refused before a decoder exists (exit 69)",
            },
            ParamDoc {
                name: "loop",
                ty: "bool",
                default: "false",
                doc: "file sources only: start again at the end",
            },
            ParamDoc {
                name: "live_video",
                ty: "\"encode\" | \"stills\"",
                default: "\"encode\"",
                doc: "a source with no H.264 of its own (a test pattern, a raw camera, a file in \
                      another codec): \"encode\" encodes its frames to H.264 once, for all its \
                      viewers, only while someone watches (/api/video/NAME); \"stills\": its \
                      tile shows stills. A source with H.264 always sends its own",
            },
            ParamDoc {
                name: "retain_days",
                ty: "float in (0, 36525]",
                default: "forever",
                doc: "files written of this source (by any sink) older than this are deleted",
            },
            ParamDoc {
                name: "max_gb",
                ty: "float > 0",
                default: "no cap",
                doc: "the files of this source, every sink together, are kept under this many \
                      GB, the oldest deleted first",
            },
        ],
    },
    Table {
        header: "[sources.NAME.calibration]",
        summary: "where the camera's pixels lie on the ground: four or more points of its \
                  picture and their places on the ground in metres (a homography), so tracks \
                  carry their ground place and speed_kmh; guide: docs/guides/analytics.md",
        keys: &[
            ParamDoc {
                name: "size",
                ty: "[width, height]",
                default: "required",
                doc: "the picture the points were read on, in pixels; frames of another size \
                      are scaled to it",
            },
            ParamDoc {
                name: "image",
                ty: "list of [x, y]",
                default: "required",
                doc: "at least 4 points of the picture, pixels, inside it, spread over the \
                      ground (no three in a line)",
            },
            ParamDoc {
                name: "ground",
                ty: "list of [x, y]",
                default: "required",
                doc: "the same points' places on the ground, metres, in the same order; more \
                      than 4 are fitted, and a point off the others' plane by over 1 m is refused",
            },
        ],
    },
    Table {
        header: "[sources.NAME.reconnect]",
        summary: "how a lost stream is retried: the delay doubles from initial_delay_ms up to \
                  max_delay_ms, with +-20% jitter",
        keys: &[
            ParamDoc {
                name: "initial_delay_ms",
                ty: "integer >= 10",
                default: "500",
                doc: "the first retry's delay",
            },
            ParamDoc {
                name: "max_delay_ms",
                ty: "integer >= initial_delay_ms",
                default: "30000",
                doc: "the longest delay between retries",
            },
            ParamDoc {
                name: "max_attempts",
                ty: "integer",
                default: "never give up",
                doc: "attempts after a loss before the source gives up (exit 69)",
            },
            ParamDoc {
                name: "reset_after_ms",
                ty: "integer",
                default: "10000",
                doc: "a stream that ran this long resets the delay; the retries of its outage \
                      stay at initial_delay_ms for this long before they double",
            },
        ],
    },
];

/// The tables of a pipeline file besides sources, steps and sinks.
pub static OTHER_TABLES: &[Table] = &[
    Table {
        header: "[executor]",
        summary: "the worker pool that runs every step of every frame",
        keys: &[
            ParamDoc {
                name: "workers",
                ty: "integer in [1, 256]",
                default: "number of cores",
                doc: "threads of the persistent pool (a restart is needed to change it)",
            },
            ParamDoc {
                name: "max_in_flight",
                ty: "integer in [1, 1024]",
                default: "2 x workers",
                doc: "frames inside the workflow at once",
            },
            ParamDoc {
                name: "on_step_error",
                ty: "\"skip_frame\" | \"stop\"",
                default: "\"skip_frame\"",
                doc: "a failed step fails its frame, or drains, closes the sinks and exits 70",
            },
            ParamDoc {
                name: "opencv_threads",
                ty: "integer in [1, 256]",
                default: "1",
                doc: "threads OpenCV may use inside one call (the pool is where parallelism \
                      comes from)",
            },
        ],
    },
    Table {
        header: "[daemon]",
        summary: "the run as a whole",
        keys: &[ParamDoc {
            name: "stop_timeout_s",
            ty: "integer in [1, 3600]",
            default: "20",
            doc: "the whole shutdown ends this long after a stop request: the drain gets \
                  three quarters, the sinks the last quarter; what is left is abandoned \
                  (exit 70)",
        }],
    },
    Table {
        header: "[storage]",
        summary: "free space kept on every filesystem vidflow writes to (by deleting only \
                  files vidflow wrote, oldest first)",
        keys: &[
            ParamDoc {
                name: "min_free_gb",
                ty: "float > 0",
                default: "none",
                doc: "GB kept free on each filesystem",
            },
            ParamDoc {
                name: "min_free_percent",
                ty: "float in (0, 100)",
                default: "none",
                doc: "share of each filesystem kept free",
            },
        ],
    },
    Table {
        header: "[http]",
        summary: "the endpoint serving /metrics, /healthz, /preview/SOURCE, /stats.json and a \
                  page (read at start: a reload does not change it)",
        keys: &[
            ParamDoc {
                name: "listen",
                ty: "IP address and port",
                default: "required",
                doc: "where it listens, e.g. \"127.0.0.1:9464\" (a port in use: exit 69)",
            },
            ParamDoc {
                name: "allowed_hosts",
                ty: "list of strings",
                default: "none",
                doc: "host names answered beside localhost, 127.0.0.1, [::1] and the listen \
                      address (others get 421)",
            },
            ParamDoc {
                name: "token_file",
                ty: "path",
                default: "none",
                doc: "a file holding a bearer token every path but /healthz then asks for; \
                      relative to $CREDENTIALS_DIRECTORY when set",
            },
            ParamDoc {
                name: "basic_user",
                ty: "string",
                default: "none",
                doc: "basic auth's user, with basic_password_hash",
            },
            ParamDoc {
                name: "basic_password_hash",
                ty: "string",
                default: "none",
                doc: "the password's Argon2 hash, a PHC string (vidflow hash-password)",
            },
            ParamDoc {
                name: "basic_password_sha256",
                ty: "string",
                default: "none",
                doc: "deprecated (warned at every start): the password's unsalted SHA-256 in \
                      hex; use basic_password_hash",
            },
        ],
    },
];

/// Keys every step takes besides its kind's own and its inputs.
pub static STEP_KEYS: &[ParamDoc] = &[
    ParamDoc {
        name: "kind",
        ty: "string",
        default: "required",
        doc: "the step kind",
    },
    ParamDoc {
        name: "every_n_frames",
        ty: "integer >= 1",
        default: "1",
        doc: "the step runs on frames whose number (per source, from 0) is a multiple of this, \
              and is skipped on the others",
    },
];

/// Keys every sink takes besides its kind's own and its inputs.
pub static SINK_KEYS: &[ParamDoc] = &[
    ParamDoc {
        name: "kind",
        ty: "string",
        default: "required",
        doc: "the sink kind",
    },
    ParamDoc {
        name: "sources",
        ty: "list of strings",
        default: "every source",
        doc: "the sources whose frames this sink takes",
    },
    ParamDoc {
        name: "on_full",
        ty: "\"block\" | \"drop_oldest\"",
        default: "\"block\" (files), \"drop_oldest\" (network sinks)",
        doc: "when the sink's queue (16 results) is full: wait for room, or drop the oldest \
              result and count it",
    },
];
