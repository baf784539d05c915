//! A real MQTT broker (`mosquitto`, Debian package `mosquitto`) on a free port of 127.0.0.1,
//! started by the test with its own configuration file, and a real subscriber (rumqttc) that
//! collects what it receives. Used by `tests/mqtt.rs` and `scripts/bench-mqtt`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Packet, QoS};

/// A `mosquitto` process; killed when dropped.
pub struct Broker {
    pub port: u16,
    /// Where it saves its sessions (every second: `autosave_interval 1`, and when it stops).
    db: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
}

impl Broker {
    /// Starts a broker in `dir` that keeps the sessions of offline subscribers across its own
    /// restarts (`persistence`), so a restart mid-run loses nothing a QoS 1 subscriber asked for.
    /// `extra` lines are added to its configuration (e.g. a password file).
    pub fn start(dir: &Path, extra: &str) -> Self {
        let port = crate::common::free_port();
        let data = dir.join("mosquitto-data");
        std::fs::create_dir_all(&data).unwrap();
        let conf = dir.join("mosquitto.conf");
        let anonymous = if extra.contains("password_file") {
            "false"
        } else {
            "true"
        };
        // Run as root, mosquitto would switch to the user `mosquitto`, who cannot write here.
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_owned();
        std::fs::write(
            &conf,
            format!(
                "user {user}\nlistener {port} 127.0.0.1\nallow_anonymous {anonymous}\npersistence true\n\
                 persistence_location {}/\nautosave_interval 1\nmax_queued_messages 0\nlog_dest stderr\n{extra}\n",
                data.display()
            ),
        )
        .unwrap();
        let mut broker = Self {
            port,
            db: data.join("mosquitto.db"),
            conf,
            child: None,
        };
        broker.restart();
        broker
    }

    /// Starts (again) the broker process on the same port, and waits until it accepts.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let log = self.conf.with_extension("log");
        let conf = self.conf.as_os_str();
        let child =
            crate::common::start_server("mosquitto", &["-c".as_ref(), conf], &log, self.port);
        self.child = Some(child);
    }

    /// Stops the broker with SIGTERM (it saves its sessions) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
    }

    /// Sends a signal to the running broker (`STOP` pauses it: it reads and acknowledges
    /// nothing until `CONT`).
    pub fn signal(&self, name: &str) {
        let child = self.child.as_ref().unwrap();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Kills the broker (SIGKILL: what it received since its last save is gone).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Waits until the broker has saved its sessions after `since`.
    pub fn wait_saved_after(&self, since: std::time::SystemTime) {
        let start = Instant::now();
        while !std::fs::metadata(&self.db)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > since)
        {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "mosquitto never saved"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One message as the subscriber got it.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    /// The payload as JSON (`null` if it is not).
    pub payload: serde_json::Value,
    pub raw: Vec<u8>,
}

/// A QoS 1 subscriber with a persistent session (`clean_session = false`) that reconnects
/// after a broker restart and keeps everything it receives, in order.
pub struct Subscriber {
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    client: Client,
    thread: Option<JoinHandle<()>>,
}

impl Subscriber {
    /// Subscribes to `filter` and waits until the broker has confirmed it.
    pub fn start(port: u16, filter: &str) -> Self {
        let mut options = MqttOptions::new(format!("test-sub-{port}"), "127.0.0.1", port);
        options
            .set_clean_session(false)
            .set_keep_alive(Duration::from_secs(5))
            .set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut connection) = Client::new(options, 64);
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (subscribed_tx, subscribed) = std::sync::mpsc::channel();
        let thread = {
            let (client, received, stop) = (client.clone(), received.clone(), stop.clone());
            let filter = filter.to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match connection.recv_timeout(Duration::from_millis(200)) {
                        Err(rumqttc::RecvTimeoutError::Timeout) => {}
                        Err(rumqttc::RecvTimeoutError::Disconnected) => break,
                        Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                            client
                                .try_subscribe(filter.as_str(), QoS::AtLeastOnce)
                                .unwrap();
                        }
                        Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                            let _ = subscribed_tx.send(());
                        }
                        Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                            received.lock().unwrap().push(Received {
                                topic: p.topic.clone(),
                                payload: serde_json::from_slice(&p.payload)
                                    .unwrap_or(serde_json::Value::Null),
                                raw: p.payload.to_vec(),
                            });
                        }
                        Ok(Ok(_)) => {}
                        Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })
        };
        subscribed
            .recv_timeout(Duration::from_secs(30))
            .expect("the subscriber never got its SubAck");
        Self {
            received,
            stop,
            client,
            thread: Some(thread),
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Waits until at least `n` messages arrived (a hang is a failure, not a slow machine).
    pub fn wait_for(&self, n: usize, deadline: Duration) {
        let start = Instant::now();
        while self.count() < n {
            assert!(
                start.elapsed() < deadline,
                "the subscriber got {} messages, not {n}",
                self.count()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.client.try_disconnect();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
