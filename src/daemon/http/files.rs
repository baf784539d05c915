//! A file of the media folders (a snapshot, a clip, a recording) sent on an API thread, whole
//! or the one byte range asked for (`Range: bytes=A-B`, `A-`, `-N`), so a browser can seek a
//! video. Only files the storage lists (vidflow wrote them and has not deleted them) are
//! served: a path from the database or the URL that names anything else is a 404, never read.
//! Answers are `Cache-Control: private`: a browser may keep a file a minute, a shared cache
//! (a proxy in front) never keeps what one user's credentials were asked for.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest a whole file may take to send: a client that reads a byte now and then lets its
/// API thread go at this point.
const SEND_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes read and written per step.
const CHUNK: usize = 64 * 1024;

/// The bytes `range` asks of a file of `len` bytes: `Ok(None)` for the whole file, `Err` when
/// it asks for none of it (416).
pub(super) fn parse_range(range: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    // Several ranges: the whole file (a multipart answer buys a browser nothing).
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(len.saturating_sub(1))
        };
        (start, end)
    };
    if len == 0 || start >= len || end < start {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// Sends `path` (or its range) as `content_type`; the caller has checked it is a kept file.
pub(super) fn send(
    stream: &mut TcpStream,
    path: &Path,
    content_type: &str,
    range: Option<&str>,
) -> std::io::Result<()> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(_) => {
            let body = super::response(404, "text/plain", b"the file is gone\n", "");
            return stream.write_all(&body);
        }
    };
    let len = file.metadata()?.len();
    let (status, start, end) = match parse_range(range, len) {
        Ok(None) => (200, 0, len.saturating_sub(1)),
        Ok(Some((a, b))) => (206, a, b),
        Err(()) => {
            let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            return stream.write_all(head.as_bytes());
        }
    };
    let count = if len == 0 { 0 } else { end - start + 1 };
    let range_line = if status == 206 {
        format!("Content-Range: bytes {start}-{end}/{len}\r\n")
    } else {
        String::new()
    };
    let reason = if status == 206 {
        "Partial Content"
    } else {
        "OK"
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {count}\r\n\
         {range_line}Accept-Ranges: bytes\r\nCache-Control: private, max-age=60\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    file.seek(SeekFrom::Start(start))?;
    let deadline = Instant::now() + SEND_DEADLINE;
    let mut left = count;
    let mut buf = vec![0u8; CHUNK];
    while left > 0 {
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "file send deadline",
            ));
        }
        let want = usize::try_from(left).unwrap_or(CHUNK).min(CHUNK);
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        stream.write_all(&buf[..n])?;
        left -= n as u64;
    }
    stream.flush()
}

/// The content type of a media file, by its extension.
pub(super) fn content_type(path: &Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("mp4") => "video/mp4",
        Some("mkv") => "video/x-matroska",
        Some("ts") => "video/mp2t",
        Some("jsonl") => "application/jsonl",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_give_the_bytes_a_browser_asks_for() {
        assert_eq!(parse_range(None, 100), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-"), 100), Ok(Some((0, 99))));
        assert_eq!(parse_range(Some("bytes=10-19"), 100), Ok(Some((10, 19))));
        assert_eq!(parse_range(Some("bytes=90-500"), 100), Ok(Some((90, 99))));
        assert_eq!(parse_range(Some("bytes=-10"), 100), Ok(Some((90, 99))));
        assert_eq!(parse_range(Some("bytes=0-1,5-6"), 100), Ok(None));
        assert_eq!(parse_range(Some("bytes=100-"), 100), Err(()));
        assert_eq!(parse_range(Some("bytes=5-4"), 100), Err(()));
        assert_eq!(parse_range(Some("bytes=x-"), 100), Err(()));
    }
}
