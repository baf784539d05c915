//! systemd's notify protocol (`Type=notify`): one datagram to `$NOTIFY_SOCKET` per state.
//! Without that variable (not under systemd) every call does nothing.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to systemd, if it is listening.
pub fn notify(state: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        send(&path, state);
    }
}

/// `RELOADING=1` with the `MONOTONIC_USEC=` systemd asks to come with it.
pub fn reloading() -> String {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    let usec = i128::from(now.tv_sec) * 1_000_000 + i128::from(now.tv_nsec) / 1_000;
    format!("RELOADING=1\nMONOTONIC_USEC={usec}")
}

fn send(path: &std::ffi::OsStr, state: &str) {
    let Ok(socket) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        abstract_send(&socket, name, state)
    } else {
        socket.send_to(state.as_bytes(), path).map(drop)
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

#[cfg(target_os = "linux")]
fn abstract_send(socket: &UnixDatagram, name: &[u8], state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(state.as_bytes(), &addr).map(drop)
}

#[cfg(not(target_os = "linux"))]
fn abstract_send(_: &UnixDatagram, _: &[u8], _: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_reaches_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
