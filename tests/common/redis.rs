//! A real Redis server (`redis-server`, Debian package `redis-server`) on a free port of
//! 127.0.0.1, started by the test with an append-only file in its own folder (so a SIGKILL
//! keeps what it acknowledged), and a reader (the `redis` crate) of a stream's entries.
//! Used by `tests/redis_stream.rs`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A `redis-server` process; killed when dropped.
pub struct RedisServer {
    pub port: u16,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server storing in `dir/redis`; `extra` are more `--option value` arguments.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.join("redis");
        std::fs::create_dir_all(&data).unwrap();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            data.to_str().unwrap(),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut s = Self {
            port,
            args,
            log: dir.join("redis.log"),
            child: None,
        };
        s.restart();
        s
    }

    /// Starts the process (again, same port and data) and waits until it listens.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server already running");
        let args: Vec<&std::ffi::OsStr> = self.args.iter().map(|a| a.as_ref()).collect();
        let child = crate::common::start_server("redis-server", &args, &self.log, self.port);
        self.child = Some(child);
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connection(&self, password: Option<&str>) -> redis::Connection {
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        let start = Instant::now();
        loop {
            match redis::Client::open(url.as_str())
                .unwrap()
                .get_connection_with_timeout(Duration::from_secs(5))
            {
                Ok(c) => return c,
                Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "{e}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Entries of the stream `key`, oldest first.
    pub fn entries(&self, key: &str) -> Vec<Entry> {
        let mut c = self.connection(None);
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query(&mut c)
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|e| {
                let field = |name: &str| -> String { e.get(name).unwrap() };
                Entry {
                    id: field("id"),
                    source: field("source"),
                    frame: field("frame").parse().unwrap(),
                    payload: serde_json::from_str(&field("payload")).unwrap(),
                }
            })
            .collect()
    }

    /// Entries in `key` (XLEN).
    pub fn len(&self, key: &str) -> u64 {
        redis::cmd("XLEN")
            .arg(key)
            .query(&mut self.connection(None))
            .unwrap()
    }

    /// Waits until stream `key` has at least `n` entries (a hang is a failure).
    pub fn wait_for(&self, key: &str, n: u64, deadline: Duration) {
        let start = Instant::now();
        while self.len(key) < n {
            assert!(
                start.elapsed() < deadline,
                "stream {key} has {} entries, not {n}",
                self.len(key)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One stream entry's fields.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub source: String,
    pub frame: u64,
    pub payload: serde_json::Value,
}
