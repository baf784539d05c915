//! Cutting the TCP connection of an RTSP source whose server holds its teardown.
//!
//! Why: rtspsrc reads an answer byte by byte, and once the first byte of a message is in, its
//! read can no longer be cancelled (`gstrtspconnection.c` clears `may_cancel` until the message
//! is complete, so that a message is never cut in half). A server that answers
//! `RTSP/1.0 200 OK\r\nX-Junk: ` and then sends `A` forever, with no line end, keeps that read
//! going for good: its per-read timeout never fires (bytes keep coming), rtspsrc's task never
//! ends, and setting the pipeline to NULL waits for that task forever. Only the socket can end
//! it, and rtspsrc does not give its socket away.
//!
//! How: the socket is found among this process's descriptors (`/proc/self/fd`): a TCP socket
//! whose peer is the server's address and port, opened after the connection started (its inode
//! is not in the snapshot taken then). It is recorded, with its peer address, when the
//! connection is up (its first buffer, [`Opened::settle`]; the host name resolved then, on a
//! thread of its own for at most [`RESOLVE_DEADLINE`]), and not when another connection could
//! have opened it: a cut later takes exactly that socket, whatever the name resolves to by then
//! and however other cameras name the same server (an NVR by host name for one, by address for
//! another), and a socket another connection recorded is never a candidate of this one. A
//! connection cut before it was up (wedged while connecting) resolves the name at the cut: if
//! another open connection could talk to the same address, only a single candidate is cut;
//! if the name does not resolve in time, only a single socket on that port, and only while no
//! other connection of this process uses that port. The cut
//! never closes rtspsrc's descriptor (it would close it again later, maybe after the number was
//! reused): `dup3` puts an unconnected socket in its place, so its next read fails at once
//! (ENOTCONN), and `shutdown` on our own duplicate of the original wakes a read blocked in it;
//! closing that duplicate then ends the TCP connection.
//!
//! Linux only (`/proc/self/fd`); elsewhere nothing is found and the pipeline is left behind
//! (see `teardown.rs`).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use crate::spec::Address;

/// How long a cut waits for the server's host name to resolve: the cut is part of a stop, which
/// must end within its deadline whatever the name server does.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(2);

/// The server a connection talks to: its port, and its address when the URI gives one (a host
/// name is resolved at the cut, [`Server::addresses`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Server {
    host: String,
    ip: Option<IpAddr>,
    port: u16,
}

impl Server {
    /// The server of an RTSP address (port 554, or 322 for rtsps, unless given).
    pub(super) fn of(address: &Address) -> Option<Self> {
        let url = address.without_credentials();
        let host = url.host_str()?.to_owned();
        let default = if url.scheme().eq_ignore_ascii_case("rtsps") {
            322
        } else {
            554
        };
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok();
        Some(Self {
            host,
            ip,
            port: url.port().unwrap_or(default),
        })
    }

    /// The addresses a peer of this server has: the URI's, or what its host name resolves to
    /// now; `None` where it did not resolve within [`RESOLVE_DEADLINE`].
    fn addresses(&self) -> Option<Vec<IpAddr>> {
        if let Some(ip) = self.ip {
            return Some(vec![ip]);
        }
        let (tx, rx) = mpsc::channel();
        let name = (self.host.clone(), self.port);
        // A name server that never answers leaves this thread behind until the resolver gives
        // up; the cut goes on without it.
        std::thread::Builder::new()
            .name("vidflow-resolve".to_owned())
            .spawn(move || {
                let found = name
                    .to_socket_addrs()
                    .map(|all| all.map(|a| a.ip()).collect::<Vec<_>>());
                let _ = tx.send(found);
            })
            .ok()?;
        rx.recv_timeout(RESOLVE_DEADLINE)
            .ok()?
            .ok()
            .filter(|all| !all.is_empty())
    }
}

/// Whether a peer is the server's: its port, and one of its addresses where they are known.
fn is(addresses: Option<&[IpAddr]>, port: u16, ip: IpAddr, peer_port: u16) -> bool {
    peer_port == port
        && addresses.is_none_or(|all| {
            all.iter()
                .any(|mine| mine.to_canonical() == ip.to_canonical())
        })
}

/// The connections of this process that are open (see [`Opened`]), by a number of their own:
/// each one's port and the addresses its server is known by (the URI's address, or the peers
/// of the sockets it was seen to open), and every socket some connection was seen to open. A
/// cut never takes another connection's socket, and takes only a sure socket when another
/// connection could own one of its candidates.
static OPEN: Mutex<Option<Open>> = Mutex::new(None);

#[derive(Debug, Default)]
struct Open {
    next: u64,
    connections: HashMap<u64, Known>,
    /// Socket inodes some open connection owns (`Opened::settle`).
    owned: HashSet<u64>,
}

/// What is known of one open connection's server.
#[derive(Debug)]
struct Known {
    port: u16,
    /// `None`: a host name not resolved, and no socket of its own seen yet.
    addresses: Option<Vec<IpAddr>>,
}

fn open() -> std::sync::MutexGuard<'static, Option<Open>> {
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection to `server`, known while it lives.
#[derive(Debug)]
pub(super) struct Opened {
    pub(super) server: Server,
    id: u64,
    /// Socket inodes of this process when the connection started.
    before: HashSet<u64>,
    /// The sockets it was seen to open, with their peers, recorded once it was up
    /// ([`Opened::settle`]): what a cut takes, by peer address and inode, with no name to
    /// resolve again (a DNS answer that changed) and no other connection's socket to mistake
    /// for its own (one server named by host name here and by address there).
    own: Mutex<Vec<(u64, (IpAddr, u16))>>,
    settled: AtomicBool,
}

impl Opened {
    pub(super) fn new(server: Server) -> Self {
        let mut guard = open();
        let all = guard.get_or_insert_with(Open::default);
        all.next += 1;
        let id = all.next;
        all.connections.insert(
            id,
            Known {
                port: server.port,
                addresses: server.ip.map(|ip| vec![ip]),
            },
        );
        Self {
            server,
            id,
            before: sockets().into_keys().collect(),
            own: Mutex::new(Vec::new()),
            settled: AtomicBool::new(false),
        }
    }

    /// Records the sockets this connection opened, once, when it is up (its first buffer came
    /// over them): the new sockets to the server's port and address (its name resolved now,
    /// at connect time) that no other connection owns, when they are surely its own (a single
    /// one, or no other connection to that server could have made one since this began).
    pub(super) fn settle(&self) {
        if self.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        let addresses = self.server.addresses();
        let port = self.server.port;
        let mut guard = open();
        let all = guard.get_or_insert_with(Open::default);
        let found: Vec<(u64, (IpAddr, u16))> = sockets()
            .into_iter()
            .filter(|(inode, _)| !self.before.contains(inode) && !all.owned.contains(inode))
            .filter_map(|(inode, fd)| {
                let at = peer(fd)?;
                is(addresses.as_deref(), port, at.0, at.1).then_some((inode, at))
            })
            .collect();
        let sure = found.len() == 1
            || (!found.is_empty() && others(all, self.id, port, addresses.as_deref()) == 0);
        if !sure {
            return;
        }
        all.owned.extend(found.iter().map(|(inode, _)| *inode));
        if let Some(known) = all.connections.get_mut(&self.id) {
            let mut peers: Vec<IpAddr> = found.iter().map(|(_, (ip, _))| *ip).collect();
            peers.dedup();
            known.addresses = Some(peers);
        }
        *self.own.lock().unwrap_or_else(PoisonError::into_inner) = found;
    }

    /// Cuts this connection's sockets; returns how many were cut, or why none was.
    pub(super) fn cut(&self) -> Result<usize, String> {
        let own = self
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if !own.is_empty() {
            // Its own sockets, known since it was up: still open under their numbers?
            let now = sockets();
            let cut = own
                .iter()
                .filter_map(|(inode, at)| now.get(inode).map(|fd| (*fd, *inode, *at)))
                .filter(|&(fd, inode, (ip, p))| cut_socket(fd, inode, Some(&[ip]), p))
                .count();
            return if cut == 0 {
                Err("its socket went away".to_owned())
            } else {
                Ok(cut)
            };
        }
        self.cut_unsettled()
    }

    /// A cut of a connection not seen up yet (wedged while connecting): its candidates are the
    /// new sockets to its server that no other connection owns.
    fn cut_unsettled(&self) -> Result<usize, String> {
        let addresses = self.server.addresses();
        let port = self.server.port;
        let (owned, others_here, others_on_port) = {
            let guard = open();
            let empty = Open::default();
            let all = guard.as_ref().unwrap_or(&empty);
            (
                all.owned.clone(),
                others(all, self.id, port, addresses.as_deref()),
                others(all, self.id, port, None),
            )
        };
        let candidates: Vec<(u64, RawFd)> = sockets()
            .into_iter()
            .filter(|(inode, fd)| {
                !self.before.contains(inode)
                    && !owned.contains(inode)
                    && peer(*fd).is_some_and(|(ip, p)| is(addresses.as_deref(), port, ip, p))
            })
            .collect();
        match candidates.len() {
            0 => return Err("no socket to the server found".to_owned()),
            // An unresolved name: a socket on that port may be another camera's.
            n if addresses.is_none() && (n > 1 || others_on_port > 0) => {
                return Err(format!(
                    "{} did not resolve within {} s, and {n} socket(s) of this process on port {port} may be another camera's",
                    self.server.host,
                    RESOLVE_DEADLINE.as_secs()
                ));
            }
            1 => {}
            n if others_here > 0 => {
                return Err(format!(
                    "{n} sockets to the server, and another connection of this process talks to it"
                ));
            }
            _ => {}
        }
        let cut = candidates
            .into_iter()
            .filter(|&(inode, fd)| cut_socket(fd, inode, addresses.as_deref(), port))
            .count();
        if cut == 0 {
            return Err("its socket went away".to_owned());
        }
        Ok(cut)
    }
}

/// Other open connections (than `id`) that could talk to a server on `port` at one of
/// `addresses`: those known by an address among them, and those whose address is not known;
/// with `addresses` `None`, every other connection on the port.
fn others(all: &Open, id: u64, port: u16, addresses: Option<&[IpAddr]>) -> usize {
    all.connections
        .iter()
        .filter(|(other, known)| **other != id && known.port == port)
        .filter(|(_, known)| match (&known.addresses, addresses) {
            (Some(theirs), Some(mine)) => theirs
                .iter()
                .any(|t| mine.iter().any(|m| m.to_canonical() == t.to_canonical())),
            _ => true,
        })
        .count()
}

impl Drop for Opened {
    fn drop(&mut self) {
        let mut guard = open();
        if let Some(all) = guard.as_mut() {
            all.connections.remove(&self.id);
            let own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
            for (inode, _) in own.iter() {
                all.owned.remove(inode);
            }
        }
    }
}

/// Every socket descriptor of this process: inode -> descriptor.
fn sockets() -> HashMap<u64, RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return HashMap::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let fd: RawFd = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            let inode = target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            Some((inode, fd))
        })
        .collect()
}

/// The peer of a connected TCP socket.
fn peer(fd: RawFd) -> Option<(IpAddr, u16)> {
    // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_storage>()).ok()?;
    // SAFETY: `storage` is writable for `len` bytes and outlives the call; a descriptor that is
    // not a socket (or no longer open) only makes the call fail.
    let rc = unsafe {
        libc::getpeername(
            fd,
            std::ptr::from_mut(&mut storage).cast::<libc::sockaddr>(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) into the storage, which
            // is large and aligned enough for any socket address.
            let v4 = unsafe { &*std::ptr::from_ref(&storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some((IpAddr::V4(ip), u16::from_be(v4.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for a sockaddr_in6 (family AF_INET6).
            let v6 = unsafe { &*std::ptr::from_ref(&storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some((IpAddr::V6(ip), u16::from_be(v6.sin6_port)))
        }
        _ => None,
    }
}

/// The inode of an open descriptor, if it is a socket.
fn socket_inode(fd: RawFd) -> Option<u64> {
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable and outlives the call; a closed descriptor only makes it fail.
    if unsafe { libc::fstat(fd, &raw mut st) } != 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some(st.st_ino)
}

/// Cuts the socket at `fd` if it still is the one found (same inode, same peer). Returns
/// whether it did.
fn cut_socket(fd: RawFd, inode: u64, addresses: Option<&[IpAddr]>, port: u16) -> bool {
    // Our own reference to the socket first: from here on, what is checked and shut down is
    // that socket, whatever happens to the number `fd`.
    // SAFETY: dup on any number is sound; it fails if `fd` is not open.
    let original = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if original < 0 {
        return false;
    }
    let ours = socket_inode(original) == Some(inode)
        && peer(original).is_some_and(|(ip, p)| is(addresses, port, ip, p));
    let mut cut = false;
    if ours {
        // SAFETY: creates a new socket descriptor owned here; no memory is involved.
        let dead =
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if dead >= 0 {
            // SAFETY: `fd` was the wedged connection's socket a moment ago and that connection
            // cannot close it while its read is held (the reason for the cut); dup3 atomically
            // makes the number refer to the unconnected socket, which rtspsrc closes later in
            // place of the original. `dead` is ours and closed right after.
            cut = unsafe { libc::dup3(dead, fd, libc::O_CLOEXEC) } == fd;
            // SAFETY: `dead` is a descriptor made above and not used after this.
            unsafe { libc::close(dead) };
        }
        // SAFETY: `original` is our own duplicate of the socket: shutting it down wakes a read
        // blocked in it (which then sees the end of the stream).
        unsafe { libc::shutdown(original, libc::SHUT_RDWR) };
    }
    // SAFETY: `original` is our own duplicate, closed once; with the number replaced, this is
    // the last reference, and the TCP connection ends.
    unsafe { libc::close(original) };
    cut
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use super::*;

    fn server(port: u16) -> Server {
        Server::of(&Address::parse(&format!("rtsp://127.0.0.1:{port}/x")).unwrap()).unwrap()
    }

    #[test]
    fn the_server_is_the_uris_host_and_port_with_rtsps_default() {
        let s = Server::of(&Address::parse("rtsp://u:p@10.0.0.9/x").unwrap()).unwrap();
        assert_eq!((s.ip, s.port), (Some("10.0.0.9".parse().unwrap()), 554));
        let s = Server::of(&Address::parse("rtsps://cam.local:8322/x").unwrap()).unwrap();
        assert_eq!((s.ip, s.port), (None, 8322));
        let s = Server::of(&Address::parse("rtsps://[::1]/x").unwrap()).unwrap();
        assert_eq!((s.ip, s.port), (Some("::1".parse().unwrap()), 322));
        let addresses = s.addresses().unwrap();
        assert!(is(Some(&addresses), 322, "::1".parse().unwrap(), 322));
        assert!(!is(Some(&addresses), 322, "::1".parse().unwrap(), 554));
    }

    /// Two cameras on one port, one named by host name: cutting it leaves the other's socket.
    #[test]
    fn a_camera_named_by_host_name_is_cut_without_the_other_cameras_on_its_port() {
        let here = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = here.local_addr().unwrap().port();
        // The other camera: another address, the same port (all of 127/8 is loopback).
        let there = TcpListener::bind(("127.0.0.2", port)).unwrap();
        let named =
            Server::of(&Address::parse(&format!("rtsp://localhost:{port}/x")).unwrap()).unwrap();
        assert_eq!(named.ip, None);
        let mine = Opened::new(named);
        let other = Opened::new(
            Server::of(&Address::parse(&format!("rtsp://127.0.0.2:{port}/x")).unwrap()).unwrap(),
        );
        let a = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let b = TcpStream::connect(("127.0.0.2", port)).unwrap();
        assert_eq!(mine.cut(), Ok(1));
        assert!(
            peer(a.as_raw_fd()).is_none(),
            "the named camera's socket was not cut"
        );
        assert!(
            peer(b.as_raw_fd()).is_some(),
            "the other camera's socket was cut"
        );
        drop((other, here, there));
    }

    /// One server (an NVR) named by host name for one camera and by address for another: a cut
    /// of the first takes its own socket, seen when it was up, never the other's.
    #[test]
    fn one_server_named_two_ways_is_cut_only_for_the_camera_that_holds_its_teardown() {
        let here = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = here.local_addr().unwrap().port();
        let named =
            Server::of(&Address::parse(&format!("rtsp://localhost:{port}/x")).unwrap()).unwrap();
        let mine = Opened::new(named);
        let other = Opened::new(server(port));
        let a = TcpStream::connect(("127.0.0.1", port)).unwrap();
        mine.settle();
        let b = TcpStream::connect(("127.0.0.1", port)).unwrap();
        other.settle();
        assert_eq!(mine.cut(), Ok(1));
        assert!(peer(a.as_raw_fd()).is_none(), "its socket was not cut");
        assert!(
            peer(b.as_raw_fd()).is_some(),
            "the other camera's socket was cut"
        );
        drop((other, here));
    }

    /// The server's name resolves otherwise (or not at all) by the time of the cut: the socket
    /// recorded when the connection was up is cut all the same, and nothing else.
    #[test]
    fn a_cut_takes_the_socket_seen_at_connect_whatever_the_name_resolves_to_later() {
        let here = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = here.local_addr().unwrap().port();
        let named =
            Server::of(&Address::parse(&format!("rtsp://localhost:{port}/x")).unwrap()).unwrap();
        let mut mine = Opened::new(named);
        let a = TcpStream::connect(("127.0.0.1", port)).unwrap();
        mine.settle();
        let other = Opened::new(server(port));
        let b = TcpStream::connect(("127.0.0.1", port)).unwrap();
        mine.server.host = "no-such-camera.invalid".to_owned();
        assert_eq!(mine.cut(), Ok(1));
        assert!(peer(a.as_raw_fd()).is_none());
        assert!(peer(b.as_raw_fd()).is_some());
        drop((other, here));
    }

    /// A name that does not resolve: a lone socket on the port is cut while no other connection
    /// of this process uses that port, never otherwise.
    #[test]
    fn an_unresolved_name_cuts_only_a_lone_socket_on_its_port() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let unknown = || {
            Server::of(&Address::parse(&format!("rtsp://no-such-camera.invalid:{port}/x")).unwrap())
                .unwrap()
        };
        let mine = Opened::new(unknown());
        let other = Opened::new(server(port));
        let a = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let e = mine.cut().unwrap_err();
        assert!(
            e.contains("did not resolve") && e.contains("another camera's"),
            "{e}"
        );
        assert!(peer(a.as_raw_fd()).is_some());
        drop(other);
        assert_eq!(mine.cut(), Ok(1));
    }

    /// A read blocked on a socket that a peer keeps open ends once the socket is cut, and the
    /// descriptor number stays open (now an unconnected socket), so its owner closes it safely.
    #[test]
    fn a_cut_ends_a_blocked_read_and_leaves_the_number_to_its_owner() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let opened = Opened::new(server(port));
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut peer_side, _) = listener.accept().unwrap();
        peer_side
            .write_all(b"RTSP/1.0 200 OK\r\nX-Junk: AAAA")
            .unwrap();
        let fd = client.as_raw_fd();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut total = 0;
            loop {
                match client.read(&mut buf) {
                    Ok(0) | Err(_) => return (total, client),
                    Ok(n) => total += n,
                }
            }
        });
        // The reader is in (or back to) a blocking read on a connection the peer holds open.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(opened.cut(), Ok(1));
        let (total, client) = reader.join().unwrap();
        assert_eq!(total, 29);
        // The number is still open: a socket, not connected to anyone.
        assert!(socket_inode(fd).is_some());
        assert!(peer(fd).is_none());
        drop(client);
        // The peer sees the connection end.
        let mut rest = Vec::new();
        assert_eq!(peer_side.read_to_end(&mut rest).unwrap_or(0), 0);
    }

    #[test]
    fn sockets_from_before_the_connection_are_never_cut() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let older = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let opened = Opened::new(server(port));
        assert!(opened.cut().is_err());
        assert!(peer(older.as_raw_fd()).is_some());
    }

    #[test]
    fn two_candidates_are_left_alone_while_another_connection_talks_to_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mine = Opened::new(server(port));
        let other = Opened::new(server(port));
        let a = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let b = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let e = mine.cut().unwrap_err();
        assert!(e.contains("another connection"), "{e}");
        assert!(peer(a.as_raw_fd()).is_some() && peer(b.as_raw_fd()).is_some());
        drop(other);
        assert_eq!(mine.cut(), Ok(2));
    }
}
