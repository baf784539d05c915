//! A plain HTTP client for vidflow's endpoint (one GET per connection, as it serves) and a
//! strict parser of Prometheus' text format (version 0.0.4), for `tests/http.rs` and
//! `tests/preview.rs`, with a reader of the preview's multipart stream.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Guards a read against a hang only.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A response: status and body; `None` if nothing listens (yet).
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let (status, _, mut reader) = open(port, path)?;
    let mut body = String::new();
    reader.read_to_string(&mut body).ok()?;
    Some((status, body))
}

/// Reads one part of a multipart stream: its JPEG bytes.
pub fn read_part(reader: &mut impl BufRead) -> Vec<u8> {
    let mut length = None;
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "stream ended");
        let line = line.trim_end();
        if let Some(n) = line.strip_prefix("Content-Length: ") {
            length = Some(n.parse::<usize>().unwrap());
        }
        if line.is_empty() && length.is_some() {
            break;
        }
    }
    let mut jpeg = vec![0; length.unwrap()];
    reader.read_exact(&mut jpeg).unwrap();
    jpeg
}

/// Sends a GET and reads the status line and headers; the body is left in the reader.
pub fn open(port: u16, path: &str) -> Option<(u16, Vec<String>, BufReader<TcpStream>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).ok()?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        headers.push(line);
    }
    Some((code, headers, reader))
}

/// Polls `f` until it gives `Some`; past `deadline` the test fails naming `what`.
/// Every 100 ms: each try is a request to the endpoint under test.
pub fn wait_until<T>(what: &str, deadline: Duration, f: impl FnMut() -> Option<T>) -> T {
    crate::common::poll(what, deadline, Duration::from_millis(100), f)
}

/// Samples of a scrape: metric name and labels (sorted) -> value.
pub type Samples = BTreeMap<(String, Vec<(String, String)>), f64>;

/// Parses Prometheus text strictly: every line is a `# HELP`, a `# TYPE` (once per family,
/// before its samples) or a sample of a declared family; label values are quoted and escaped;
/// values are numbers. Panics naming the first bad line.
pub fn parse_prometheus(text: &str) -> Samples {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Samples::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| -> ! { panic!("line {}: {why}: {line:?}\n{text}", n + 1) };
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !valid_name(name) {
                bad("bad metric name in HELP");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (Some(name), Some(kind), None) = (words.next(), words.next(), words.next()) else {
                bad("TYPE needs a name and a type");
            };
            if !valid_name(name)
                || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
            {
                bad("bad TYPE");
            }
            if types.insert(name.to_owned(), kind.to_owned()).is_some() {
                bad("second TYPE for a family");
            }
            if samples
                .keys()
                .any(|(s, _)| family(s, &types) == Some(name.to_owned()))
            {
                bad("TYPE after samples of its family");
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            bad("comment or empty line the exporter should not write");
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad("no value"));
        let name = &line[..name_end];
        if !valid_name(name) {
            bad("bad metric name");
        }
        if family(name, &types).is_none() {
            bad("sample of a family without TYPE");
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            let mut key = String::new();
            let end = loop {
                let Some((i, c)) = chars.next() else {
                    bad("unclosed labels")
                };
                match c {
                    '}' if key.is_empty() => break i,
                    '=' => {
                        if chars.next().map(|(_, c)| c) != Some('"') {
                            bad("label value not quoted");
                        }
                        let mut value = String::new();
                        loop {
                            match chars.next() {
                                Some((_, '\\')) => match chars.next() {
                                    Some((_, '\\')) => value.push('\\'),
                                    Some((_, '"')) => value.push('"'),
                                    Some((_, 'n')) => value.push('\n'),
                                    _ => bad("bad escape"),
                                },
                                Some((_, '"')) => break,
                                Some((_, c)) => value.push(c),
                                None => bad("unclosed label value"),
                            }
                        }
                        if !valid_name(&key) || key.contains(':') {
                            bad("bad label name");
                        }
                        labels.push((std::mem::take(&mut key), value));
                        match chars.next() {
                            Some((_, ',')) => {}
                            Some((i, '}')) => break i,
                            _ => bad("expected , or } after a label"),
                        }
                    }
                    c => key.push(c),
                }
            };
            rest = &inner[end + 1..];
        }
        let mut words = rest.split(' ');
        if words.next() != Some("") {
            bad("no space before the value");
        }
        let value = words.next().unwrap_or_else(|| bad("no value"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| bad("value is not a number")),
        };
        if let Some(ts) = words.next()
            && ts.parse::<i64>().is_err()
        {
            bad("bad timestamp");
        }
        if words.next().is_some() {
            bad("trailing text");
        }
        labels.sort();
        if samples.insert((name.to_owned(), labels), value).is_some() {
            bad("the same sample twice");
        }
    }
    samples
}

/// The declared family a sample name belongs to (histograms add `_bucket`, `_sum`, `_count`).
fn family(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_owned());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        matches!(
            types.get(base).map(String::as_str),
            Some("histogram" | "summary")
        )
        .then(|| base.to_owned())
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The value of `name` with exactly these labels.
pub fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    samples.get(&(name.to_owned(), labels)).copied()
}

/// Scrapes `/metrics` and parses it.
pub fn scrape(port: u16) -> Option<Samples> {
    let (status, body) = get(port, "/metrics")?;
    assert_eq!(status, 200, "{body}");
    Some(parse_prometheus(&body))
}

/// Sends `raw` as it is (a whole request, or a bad one) and reads the answer: status, headers
/// and body. `None` when nothing listens or the connection fails before a status line.
pub fn request(port: u16, raw: &str) -> Option<(u16, Vec<String>, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.write_all(raw.as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, lines.map(str::to_owned).collect(), body.to_owned()))
}

/// The bound: a good client's `/healthz` is answered within this, whatever else is
/// connected.
pub const HEALTHZ_BOUND: Duration = Duration::from_secs(1);

/// Asks `/healthz` as a good client and checks it is answered 200 within [`HEALTHZ_BOUND`].
pub fn assert_healthz_answers_quickly(port: u16) {
    let start = Instant::now();
    let answer = get(port, "/healthz");
    let took = start.elapsed();
    assert_eq!(answer, Some((200, "ok\n".to_owned())));
    assert!(took < HEALTHZ_BOUND, "/healthz took {took:?}");
}

/// A process's threads and open file descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub threads: usize,
    pub fds: usize,
}

pub fn load(pid: u32) -> Load {
    let count = |dir: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{dir}"))
            .unwrap()
            .count()
    };
    Load {
        threads: count("task"),
        fds: count("fd"),
    }
}

/// Waits (up to `deadline`: a guard against a hang) until `pid` holds no more threads and file
/// descriptors than `baseline`.
pub fn wait_for_baseline(pid: u32, baseline: Load, deadline: Duration) {
    let start = Instant::now();
    loop {
        let now = load(pid);
        if now.threads <= baseline.threads && now.fds <= baseline.fds {
            return;
        }
        assert!(
            start.elapsed() < deadline,
            "never back to the baseline {baseline:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to `deadline`: a guard against a hang) until `/metrics` says `source` decoded at
/// least `n` frames.
pub fn wait_for_frames(port: u16, source: &str, n: u32, deadline: Duration) {
    wait_until("frames flowing", deadline, || {
        let s = scrape(port)?;
        let decoded = value(
            &s,
            "vidflow_source_frames_decoded_total",
            &[("source", source)],
        )?;
        (decoded >= f64::from(n)).then_some(())
    });
}
