//! A request head (`GET /path HTTP/1.1`, then headers), parsed by `httparse` (the parser hyper
//! uses: maintained and fuzzed): whether it is all there, and the few parts the endpoint reads
//! (method, target, `Host`, `Authorization`, the token cookie, `Range`, whether a proxy in
//! front says the browser came over TLS, and a WebSocket's handshake: its key and `Origin`). Lines may end in CRLF or a bare LF, as RFC 9112
//! allows a recipient to accept: a client that sends bare LFs is answered at once, not at the
//! head deadline.

/// The longest request head read (GET needs no body): past it, 431 without reading more.
pub(super) const MAX_HEAD: usize = 8 * 1024;

/// Header lines read; more is a 431, like a head too long.
const MAX_HEADERS: usize = 64;

/// What the endpoint reads of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub method: String,
    pub target: String,
    pub host: Option<String>,
    pub authorization: Option<String>,
    /// The token a browser keeps in the cookie the page set (`access::TOKEN_COOKIE`),
    /// percent-decoded.
    pub cookie_token: Option<String>,
    /// `Range` (snapshots and clips are served in parts: a browser seeks).
    pub range: Option<String>,
    /// A reverse proxy in front says the browser reached it over TLS (`X-Forwarded-Proto:
    /// https`, or `Forwarded: proto=https`): the token's cookie is then `Secure`. A client
    /// that sends it itself gains nothing: it only keeps the cookie off plain HTTP.
    pub https: bool,
    /// `Sec-WebSocket-Key`, when the head asks to become a WebSocket (`Upgrade: websocket`,
    /// version 13): only `/api/video` takes it.
    pub websocket_key: Option<String>,
    /// `Origin` (a browser sends it with a WebSocket's handshake).
    pub origin: Option<String>,
}

/// Why a head cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BadHead {
    /// Not HTTP/1.x: a bad request line, a header line without `:`, bytes a header may not
    /// hold, or a second `Host`.
    Malformed,
    /// More than [`MAX_HEADERS`] header lines.
    TooManyHeaders,
}

/// The head at the start of `bytes`: `Ok(None)` while it is not all there.
pub(super) fn parse(bytes: &[u8]) -> Result<Option<Head>, BadHead> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => return Err(BadHead::TooManyHeaders),
        Err(_) => return Err(BadHead::Malformed),
    }
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return Err(BadHead::Malformed);
    };
    let mut head = Head {
        method: method.to_owned(),
        target: target.to_owned(),
        host: None,
        authorization: None,
        cookie_token: None,
        range: None,
        https: false,
        websocket_key: None,
        origin: None,
    };
    let (mut upgrade, mut version, mut key) = (false, false, None);
    for header in request.headers.iter() {
        let value = || {
            std::str::from_utf8(header.value)
                .map(|v| v.trim().to_owned())
                .map_err(|_| BadHead::Malformed)
        };
        if header.name.eq_ignore_ascii_case("host") {
            if head.host.replace(value()?).is_some() {
                return Err(BadHead::Malformed);
            }
        } else if header.name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(value()?);
        } else if header.name.eq_ignore_ascii_case("cookie") {
            if let Some(token) = cookie(&value()?, super::access::TOKEN_COOKIE) {
                head.cookie_token = Some(token);
            }
        } else if header.name.eq_ignore_ascii_case("range") {
            head.range = Some(value()?);
        } else if header.name.eq_ignore_ascii_case("x-forwarded-proto") {
            // The first proxy's (the one the browser reached), when several are chained.
            head.https |= value()?
                .split(',')
                .next()
                .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
        } else if header.name.eq_ignore_ascii_case("forwarded") {
            head.https |= forwarded_https(&value()?);
        } else if header.name.eq_ignore_ascii_case("upgrade") {
            upgrade |= value()?
                .split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("websocket"));
        } else if header.name.eq_ignore_ascii_case("sec-websocket-version") {
            version = value()? == "13";
        } else if header.name.eq_ignore_ascii_case("sec-websocket-key") {
            key = Some(value()?);
        } else if header.name.eq_ignore_ascii_case("origin") {
            head.origin = Some(value()?);
        }
    }
    if upgrade && version {
        head.websocket_key = key.filter(|k| !k.is_empty());
    }
    Ok(Some(head))
}

/// The value of cookie `name` in a `Cookie` header (`a=1; b=2`), percent-decoded.
fn cookie(header: &str, name: &str) -> Option<String> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| crate::spec::percent_decode(v))
}

/// Whether the first element of a `Forwarded` header (RFC 7239: `for=a;proto=https, for=b`)
/// says `proto=https`.
fn forwarded_https(header: &str) -> bool {
    header
        .split(',')
        .next()
        .into_iter()
        .flat_map(|element| element.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(k, v)| {
            k.eq_ignore_ascii_case("proto") && v.trim_matches('"').eq_ignore_ascii_case("https")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_gives_method_target_host_and_authorization_once_it_is_all_there() {
        let bytes =
            b"GET /metrics?x=1 HTTP/1.1\r\nhost: localhost:9464\r\nAuthorization: Bearer t\r\n\r\n";
        let head = parse(bytes).unwrap().unwrap();
        assert_eq!(head.method, "GET");
        assert_eq!(head.target, "/metrics?x=1");
        assert_eq!(head.host.as_deref(), Some("localhost:9464"));
        assert_eq!(head.authorization.as_deref(), Some("Bearer t"));
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]), Ok(None), "{cut}");
        }
    }

    #[test]
    fn the_token_cookie_is_found_among_others_and_decoded() {
        let bytes = b"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1; vidflow_token=t%3Bk; b=2\r\n\r\n";
        let head = parse(bytes).unwrap().unwrap();
        assert_eq!(head.cookie_token.as_deref(), Some("t;k"));
        let other = parse(b"GET / HTTP/1.1\r\nHost: h\r\nCookie: vidflow_tokens=x\r\n\r\n");
        assert_eq!(other.unwrap().unwrap().cookie_token, None);
    }

    #[test]
    fn a_proxy_saying_https_is_heard_in_either_header_and_only_for_https() {
        let https = |line: &str| {
            let bytes = format!("GET / HTTP/1.1\r\nHost: h\r\n{line}\r\n\r\n");
            parse(bytes.as_bytes()).unwrap().unwrap().https
        };
        assert!(https("X-Forwarded-Proto: https"));
        assert!(https("x-forwarded-proto: HTTPS, http"));
        assert!(https(
            "Forwarded: for=192.0.2.1;proto=https;host=example.net"
        ));
        assert!(https("Forwarded: proto=\"https\", for=10.0.0.1;proto=http"));
        assert!(!https("X-Forwarded-Proto: http"));
        assert!(!https("X-Forwarded-Proto: http, https"));
        assert!(!https("Forwarded: for=192.0.2.1;proto=http"));
        assert!(!https("Forwarded: for=a;proto=http, for=b;proto=https"));
        assert!(!https("X-Other: https"));
    }

    #[test]
    fn a_websocket_handshake_gives_its_key_and_origin_and_only_version_13_counts() {
        let ws = |version: &str| {
            let bytes = format!(
                "GET /api/video/cam HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: a2V5\r\n\
                 Sec-WebSocket-Version: {version}\r\nOrigin: http://h\r\n\r\n"
            );
            parse(bytes.as_bytes()).unwrap().unwrap()
        };
        let head = ws("13");
        assert_eq!(head.websocket_key.as_deref(), Some("a2V5"));
        assert_eq!(head.origin.as_deref(), Some("http://h"));
        assert_eq!(ws("8").websocket_key, None);
        let plain = parse(b"GET / HTTP/1.1\r\nHost: h\r\nSec-WebSocket-Key: a2V5\r\n\r\n");
        assert_eq!(plain.unwrap().unwrap().websocket_key, None);
    }

    #[test]
    fn lines_ending_in_a_bare_lf_are_a_whole_head() {
        let head = parse(b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.target, "/healthz");
        assert_eq!(head.host.as_deref(), Some("127.0.0.1"));
        let mixed = parse(b"GET / HTTP/1.0\r\nHost: a\n\r\n").unwrap().unwrap();
        assert_eq!(mixed.host.as_deref(), Some("a"));
        assert_eq!(parse(b"GET / HTTP/1.1\nHost: a\n"), Ok(None));
    }

    #[test]
    fn a_bad_request_line_a_bad_header_two_hosts_and_too_many_headers_are_refused() {
        for bad in [
            &b"GET /\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nnonsense\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
        ] {
            assert_eq!(
                parse(bad),
                Err(BadHead::Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(65));
        assert_eq!(parse(many.as_bytes()), Err(BadHead::TooManyHeaders));
    }
}
