//! A request head (`GET /path HTTP/1.1`, then headers): where it ends, and the few parts the
//! endpoint reads (method, target, `Host`, `Authorization`).

/// The longest request head read (GET needs no body): past it, 431 without reading more.
pub(super) const MAX_HEAD: usize = 8 * 1024;

/// What the endpoint reads of a request.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub method: String,
    pub target: String,
    pub host: Option<String>,
    pub authorization: Option<String>,
}

/// Why a head cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BadHead {
    /// No request line of three words.
    RequestLine,
    /// A header line without `:`, or a second `Host`.
    Header,
}

/// The length of the head in `bytes` (up to and including its blank line), once it is all there.
pub(super) fn end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// Parses a complete head (as [`end`] delimits it).
pub(super) fn parse(bytes: &[u8]) -> Result<Head, BadHead> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    let mut words = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target), Some(_version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(BadHead::RequestLine);
    };
    let mut head = Head {
        method: method.to_owned(),
        target: target.to_owned(),
        host: None,
        authorization: None,
    };
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(BadHead::Header)?;
        let value = value.trim().to_owned();
        if name.eq_ignore_ascii_case("host") {
            if head.host.replace(value).is_some() {
                return Err(BadHead::Header);
            }
        } else if name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(value);
        }
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_its_blank_line_and_gives_method_target_host_and_authorization() {
        let bytes = b"GET /metrics?x=1 HTTP/1.1\r\nhost: localhost:9464\r\nAuthorization: Bearer t\r\n\r\nrest";
        let n = end(bytes).unwrap();
        assert_eq!(&bytes[n..], b"rest");
        let head = parse(&bytes[..n]).unwrap();
        assert_eq!(head.method, "GET");
        assert_eq!(head.target, "/metrics?x=1");
        assert_eq!(head.host.as_deref(), Some("localhost:9464"));
        assert_eq!(head.authorization.as_deref(), Some("Bearer t"));
        assert_eq!(end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn a_bad_request_line_a_bad_header_and_two_hosts_are_refused() {
        assert_eq!(parse(b"GET /\r\n\r\n"), Err(BadHead::RequestLine));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nnonsense\r\n\r\n"),
            Err(BadHead::Header)
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Err(BadHead::Header)
        );
    }
}
