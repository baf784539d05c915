//! Real NATS servers (`nats-server`, Debian package `nats-server`) with JetStream on file
//! storage, started by the test on free ports of 127.0.0.1 (alone or as a cluster with routes),
//! and a reader (async-nats) that fetches what a stream stored, in stream order. Used by
//! `tests/nats.rs` and `scripts/bench-nats`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// One `nats-server` process; killed when dropped.
pub struct NatsServer {
    pub name: String,
    pub port: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    /// A single server with JetStream, storing in `dir/NAME`. `extra` is added to its
    /// configuration (e.g. an `authorization { ... }` block).
    pub fn start(dir: &Path, extra: &str) -> Self {
        let mut s = Self::configure(dir, "n1", crate::common::free_port(), extra);
        s.restart();
        s
    }

    fn configure(dir: &Path, name: &str, port: u16, extra: &str) -> Self {
        let store = dir.join(format!("{name}-store"));
        std::fs::create_dir_all(&store).unwrap();
        let conf = dir.join(format!("{name}.conf"));
        std::fs::write(
            &conf,
            format!(
                "server_name: {name}\nlisten: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n}}\n{extra}\n",
                store.display()
            ),
        )
        .unwrap();
        Self {
            name: name.to_owned(),
            port,
            log: dir.join(format!("{name}.log")),
            conf,
            child: None,
        }
    }

    /// Starts the server process (again, same port and storage) and waits until it listens.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server already running");
        let conf = self.conf.as_os_str();
        let child = crate::common::start_server(
            "nats-server",
            &["-c".as_ref(), conf],
            &self.log,
            self.port,
        );
        self.child = Some(child);
    }

    /// SIGKILL: no goodbye, no flush beyond what the kernel already has.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `n` servers joined by routes into one JetStream cluster, each started.
pub fn cluster(dir: &Path, n: usize) -> Vec<NatsServer> {
    let ports: Vec<(u16, u16)> = (0..n)
        .map(|_| (crate::common::free_port(), crate::common::free_port()))
        .collect();
    let routes: Vec<String> = ports
        .iter()
        .map(|(_, r)| format!("nats-route://127.0.0.1:{r}"))
        .collect();
    let mut servers: Vec<NatsServer> = ports
        .iter()
        .enumerate()
        .map(|(i, (port, route))| {
            let extra = format!(
                "cluster {{\n  name: vidflow-test\n  listen: 127.0.0.1:{route}\n  routes: [{}]\n}}\n",
                routes.join(", ")
            );
            NatsServer::configure(dir, &format!("n{}", i + 1), *port, &extra)
        })
        .collect();
    for s in &mut servers {
        s.restart();
    }
    servers
}

/// One message as the stream stored it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub msg_id: String,
    pub payload: serde_json::Value,
}

/// A JetStream client of the test's own, on a runtime of its own.
pub struct Reader {
    runtime: tokio::runtime::Runtime,
    context: async_nats::jetstream::Context,
}

impl Reader {
    /// Connects to `url` (several comma-separated for a cluster), retrying for a while.
    pub fn connect(url: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let addrs: Vec<async_nats::ServerAddr> =
            url.split(',').map(|u| u.parse().unwrap()).collect();
        let client = runtime
            .block_on(
                async_nats::ConnectOptions::new()
                    .retry_on_initial_connect()
                    .connect(addrs),
            )
            .unwrap();
        let mut context = {
            let _inside = runtime.enter();
            async_nats::jetstream::new(client)
        };
        context.set_timeout(Duration::from_secs(10));
        Self { runtime, context }
    }

    /// Messages stored in `stream`, or `None` while it does not exist (or has no leader).
    pub fn count(&self, stream: &str) -> Option<u64> {
        self.runtime.block_on(async {
            let mut s = self.context.get_stream(stream).await.ok()?;
            Some(s.info().await.ok()?.state.messages)
        })
    }

    /// Waits until `stream` holds at least `n` messages (a hang is a failure).
    pub fn wait_for(&self, stream: &str, n: u64, deadline: Duration) {
        let start = Instant::now();
        loop {
            let got = self.count(stream);
            if got.is_some_and(|c| c >= n) {
                return;
            }
            assert!(
                start.elapsed() < deadline,
                "stream {stream} holds {got:?} messages, not {n}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every message of `stream`, in stream order.
    pub fn messages(&self, stream: &str) -> Vec<Stored> {
        self.runtime.block_on(async {
            let mut s = self.context.get_stream(stream).await.unwrap();
            let state = s.info().await.unwrap().state.clone();
            let mut out = Vec::new();
            for seq in state.first_sequence..=state.last_sequence {
                // A cluster that has just elected a stream leader can fail a read for a moment:
                // such a message is read again, not left out of what the test checks.
                let mut tries = 0;
                let m = loop {
                    match s.get_raw_message(seq).await {
                        Ok(m) => break Some(m),
                        Err(e) if tries < 50 => {
                            tries += 1;
                            eprintln!("reading {stream} #{seq}: {e}; again");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            eprintln!("reading {stream} #{seq}: {e}; left out");
                            break None;
                        }
                    }
                };
                let Some(m) = m else {
                    continue;
                };
                let msg_id = m
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                out.push(Stored {
                    subject: m.subject.to_string(),
                    msg_id,
                    payload: serde_json::from_slice(&m.payload).unwrap(),
                });
            }
            out
        })
    }

    /// The name of the server leading `stream` (a cluster).
    pub fn leader(&self, stream: &str) -> Option<String> {
        self.runtime.block_on(async {
            let mut s = self.context.get_stream(stream).await.ok()?;
            s.info().await.ok()?.cluster.clone()?.leader
        })
    }
}
