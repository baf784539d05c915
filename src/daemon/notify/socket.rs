//! The datagrams themselves: where `$NOTIFY_SOCKET` points (a path, or `@name` for a socket in
//! Linux's abstract namespace) and one unbound, non-blocking datagram socket that sends each
//! message there, as `sd_notify` does.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use super::NotifyError;

/// Where systemd listens for this service's notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifySocket {
    /// A socket file (an absolute path).
    Path(PathBuf),
    /// A name in Linux's abstract namespace (`@name` in `$NOTIFY_SOCKET`, without the `@`).
    Abstract(Vec<u8>),
}

impl NotifySocket {
    /// Reads `$NOTIFY_SOCKET`: an absolute path or `@name`.
    pub fn parse(value: &OsStr) -> Result<Self, NotifyError> {
        let bytes = value.as_encoded_bytes();
        match bytes.first() {
            Some(b'@') if bytes.len() > 1 => Ok(Self::Abstract(bytes[1..].to_vec())),
            Some(b'/') => Ok(Self::Path(PathBuf::from(value))),
            _ => Err(NotifyError::Socket(value.to_string_lossy().into_owned())),
        }
    }
}

/// Sends messages to the notify socket; owned by the notify thread.
#[derive(Debug)]
pub(super) struct Datagrams {
    socket: UnixDatagram,
    target: NotifySocket,
    /// Whether a send failed already: the first failure is a warning, the others debug.
    failed: bool,
}

impl Datagrams {
    /// Non-blocking: if systemd does not read (its queue is full), a message is lost rather
    /// than the thread held, so that the end of the run never waits for systemd.
    pub(super) fn open(target: NotifySocket) -> std::io::Result<Self> {
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket,
            target,
            failed: false,
        })
    }

    /// Sends one message (`KEY=VALUE` lines, as `sd_notify` takes them).
    pub(super) fn send(&mut self, message: &str) {
        let sent = match &self.target {
            NotifySocket::Path(path) => self.socket.send_to(message.as_bytes(), path).map(drop),
            NotifySocket::Abstract(name) => abstract_send(&self.socket, name, message),
        };
        match sent {
            Ok(()) => tracing::trace!(message, "sd_notify"),
            Err(e) if !self.failed => {
                self.failed = true;
                tracing::warn!(error = %e, socket = ?self.target, message, "systemd notify: cannot send");
            }
            Err(e) => tracing::debug!(error = %e, message, "systemd notify: cannot send"),
        }
    }
}

#[cfg(target_os = "linux")]
fn abstract_send(socket: &UnixDatagram, name: &[u8], message: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(message.as_bytes(), &addr).map(drop)
}

#[cfg(not(target_os = "linux"))]
fn abstract_send(_: &UnixDatagram, _: &[u8], _: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract sockets exist on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(listener: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn a_message_reaches_a_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let target = NotifySocket::parse(path.as_os_str()).unwrap();
        assert_eq!(target, NotifySocket::Path(path.clone()));
        let mut datagrams = Datagrams::open(target).unwrap();
        datagrams.send("READY=1");
        datagrams.send("STATUS=cam streaming");
        assert_eq!(received(&listener), "READY=1");
        assert_eq!(received(&listener), "STATUS=cam streaming");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_message_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("vidflow-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let target = NotifySocket::parse(OsStr::new(&format!("@{name}"))).unwrap();
        assert_eq!(target, NotifySocket::Abstract(name.into_bytes()));
        Datagrams::open(target).unwrap().send("WATCHDOG=1");
        assert_eq!(received(&listener), "WATCHDOG=1");
    }

    #[test]
    fn a_relative_path_is_not_a_notify_socket() {
        for bad in ["notify.sock", "", "@"] {
            let e = NotifySocket::parse(OsStr::new(bad)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "NOTIFY_SOCKET \"{bad}\": not an absolute path or an abstract socket (@name)"
                )
            );
        }
    }

    /// systemd that does not read (its queue full): each message is dropped at once rather
    /// than the notify thread held, so that nothing (the end of a run) waits on systemd.
    #[test]
    fn a_socket_nobody_reads_never_holds_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let target = NotifySocket::parse(path.as_os_str()).unwrap();
        let (done, sent) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut datagrams = Datagrams::open(target).unwrap();
            // Far more than a datagram socket queues (its default is 10 to 200 or so).
            for n in 0..5_000 {
                datagrams.send(&format!("STATUS={n}"));
            }
            let _ = done.send(());
        });
        sent.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the sender was held by a socket nobody reads");
        listener.set_nonblocking(true).unwrap();
        let mut queued = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(n) = listener.recv(&mut buf) {
            queued.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
        // The first ones were queued, in order; the rest were dropped, not waited for.
        assert!(
            !queued.is_empty() && queued.len() < 5_000,
            "{}",
            queued.len()
        );
        assert_eq!(queued[0], "STATUS=0");
        assert_eq!(
            queued.last().unwrap(),
            &format!("STATUS={}", queued.len() - 1)
        );
    }
}
