//! The little of WebSocket (RFC 6455) that live video takes: the handshake's answer, and the
//! server's unmasked frames, one binary message per segment (and one text message first, with
//! what plain HTTP gives in headers, which a page cannot read from a WebSocket's handshake).
//! Why a WebSocket at all: a browser opens at most six HTTP/1.1 connections to a host, and a
//! page of 16 cameras, each a long-lived response, would take them all; WebSockets are not
//! counted among those six. The client's own messages are not read, but a close frame (or its
//! end of the connection) ends the viewer. No thread.

use base64::Engine as _;
use sha1::{Digest, Sha1};

/// RFC 6455's fixed key suffix.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Opcodes: text, binary, close (RFC 6455 5.2).
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
pub(super) const CLOSE: u8 = 0x8;

/// `Sec-WebSocket-Accept` for the client's `Sec-WebSocket-Key`.
pub(super) fn accept_key(key: &str) -> String {
    let mut hash = Sha1::new();
    hash.update(key.trim().as_bytes());
    hash.update(GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(hash.finalize())
}

/// The handshake's answer.
pub(super) fn switching(key: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\nCache-Control: no-store\r\n\r\n",
        accept_key(key)
    )
    .into_bytes()
}

/// The header of a whole, unmasked message of `len` bytes: text or binary.
pub(super) fn frame_header(len: usize, text: bool) -> Vec<u8> {
    let opcode = if text { TEXT } else { BINARY };
    let mut out = vec![0x80 | opcode];
    match len {
        0..=125 => out.push(u8::try_from(len).unwrap_or(125)),
        126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out
}

/// A close message (status 1000: normal), as the server's last.
pub(super) fn close_frame() -> Vec<u8> {
    vec![0x80 | CLOSE, 2, 0x03, 0xe8]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_key_is_rfc_6455s_example() {
        // RFC 6455 1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn a_message_length_takes_one_two_or_eight_bytes() {
        assert_eq!(frame_header(5, true), [0x81, 5]);
        assert_eq!(frame_header(300, false), [0x82, 126, 1, 44]);
        assert_eq!(
            frame_header(70_000, false),
            [0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]
        );
    }
}
