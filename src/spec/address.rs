//! URLs that may carry a user and password (`rtsp://user:password@host/...`, an MQTT broker, a
//! webhook): parsed once, by the `url` crate (WHATWG URL parsing with percent-encoding), and that
//! one parse is what vidflow connects with and what it prints. Two parsers that split the
//! authority at different characters are how a password leaks: the parse that found the host is
//! the one that says where the password is.
//!
//! What a user writes for a password with reserved characters: percent-encoded, `#` as `%23`,
//! `?` as `%3F`, `/` as `%2F`, `@` as `%40`, `:` as `%3A`, `%` as `%25`, a space as `%20`; or the
//! password apart from the URL (a source's `password`/`password_file`, an MQTT sink's
//! `password_file`), where it is taken as it is. Written raw:
//! - `@` and `:` are understood (the last `@` before the host ends the user part, the first `:`
//!   in it ends the user), as is a space.
//! - `#`, `?` and `/` end the authority, so no URL parser can tell them from the host's end: a
//!   URL with an `@` after its host is refused ([`AddressError::Ambiguous`]), and one that does
//!   not parse at all is refused too; a lone `%` is refused ([`AddressError::Escape`]).
//!
//! Every message quotes the URL through [`redact`], which never shows the password, even in
//! part: when the URL does not parse, or parses with an `@` after its host, everything between
//! the scheme's `:` and the last `@` is hidden. [`redact`] and [`redact_all`] take any text
//! (GStreamer's log callback hands them whatever an element printed): they slice only at ASCII
//! characters they found, never past a character they did not check, so no text makes them
//! panic; `tests/redaction.rs` fuzzes them with arbitrary Unicode.

use std::fmt;

use percent_encoding::utf8_percent_encode;
use url::Url;

use super::secret::{Secret, USERINFO};

/// How to write a password in a URL, for the messages that refuse one (public so that a test
/// can tell this fixed advice from a password that happens to spell part of it).
pub const HOW: &str = "write '#', '?', '/', '@' and '%' in a user or password as %23, %3F, %2F, %40 \
                   and %25, or give the password apart from the url";

/// Why a URL was refused. Messages quote the URL only through [`redact`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("url \"{shown}\": {reason}; {HOW}")]
    Unparsable { shown: String, reason: String },
    #[error("url \"{shown}\": an '@' after the host; {HOW} (an '@' in a path or query as %40)")]
    Ambiguous { shown: String },
    #[error("url \"{shown}\": bad %-escape in the {part}; {HOW}")]
    Escape { shown: String, part: &'static str },
    #[error("url \"{shown}\": no host")]
    NoHost { shown: String },
}

/// A URL with its credentials taken apart: the URL without them, to connect to, and the user
/// and password decoded. `Display` shows the URL as written, password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Address {
    /// The parsed URL without user and password.
    bare: Url,
    /// The decoded user; empty when there is none.
    user: String,
    /// The decoded password, when the URL has one.
    password: Option<Secret>,
    /// What the user wrote, redacted.
    shown: String,
}

impl Address {
    /// Parses `text` (see the module docs for what is refused).
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let shown = redact(text);
        let url = Url::parse(text).map_err(|e| AddressError::Unparsable {
            shown: shown.clone(),
            reason: e.to_string(),
        })?;
        if after_host(&url).contains('@') {
            return Err(AddressError::Ambiguous { shown });
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(AddressError::NoHost { shown });
        }
        let decode = |part: &'static str, s: &str| {
            super::percent_decode(s).ok_or_else(|| AddressError::Escape {
                shown: shown.clone(),
                part,
            })
        };
        let user = decode("user", url.username())?;
        let password = url
            .password()
            .map(|p| decode("password", p).map(Secret::new))
            .transpose()?;
        let mut bare = url;
        // Only fail for a URL without a host, refused above.
        let _ = bare.set_password(None);
        let _ = bare.set_username("");
        Ok(Self {
            bare,
            user,
            password,
            shown,
        })
    }

    /// The URL without user and password, for a client given them apart.
    pub fn without_credentials(&self) -> &Url {
        &self.bare
    }

    /// The URL as the `url` crate writes it, user and password percent-encoded: for a client
    /// that takes the credentials from the URL.
    pub fn expose(&self) -> String {
        let mut full = self.bare.clone();
        // Only fail for a URL without a host, refused in `parse`.
        let _ = full.set_username(&utf8_percent_encode(&self.user, USERINFO).to_string());
        if let Some(p) = &self.password {
            let _ = full.set_password(Some(&utf8_percent_encode(p.expose(), USERINFO).to_string()));
        }
        full.into()
    }

    /// The decoded user; empty when the URL has none.
    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// Whether the URL carries a user or a password.
    pub fn has_credentials(&self) -> bool {
        !self.user.is_empty() || self.password.is_some()
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({})", self.shown)
    }
}

/// Path, query and fragment of a parsed URL: where an `@` means a password held `#`, `?` or `/`.
fn after_host(url: &Url) -> &str {
    &url[url::Position::AfterPort..]
}

/// `uri` as written, with its password replaced by `***`. When the `url` crate's parse is sure
/// where the password is (the URL parses, has an authority and no `@` after its host), the user
/// stays. When it is not, everything between the scheme's `:` (and the slashes after it) and the
/// last `@` goes: a password always lies there, whatever the parse made of the text. Text
/// without a `:` before an `@` holds no password and comes back as it is.
pub fn redact(uri: &str) -> String {
    let sure = match Url::parse(uri) {
        Ok(url) if url.has_authority() && !after_host(&url).contains('@') => {
            if url.password().is_none() {
                return uri.to_owned();
            }
            true
        }
        _ => false,
    };
    hide_userinfo(uri, sure)
}

/// `text` with its user and password, or only its password (`keep_user`), replaced by `***`:
/// what lies between the first `:` (the scheme's end, then any slashes, and the tabs and
/// newlines a URL parser skips) and the last `@` (the userinfo's end), or from the first `:` in
/// that userinfo (the user's end, as the `url` crate splits it). Every index is that of an ASCII
/// character, so every slice is at a character boundary, whatever the text holds.
fn hide_userinfo(text: &str, keep_user: bool) -> String {
    let Some(at) = text.rfind('@') else {
        return text.to_owned();
    };
    let Some(colon) = text[..at].find(':') else {
        return text.to_owned();
    };
    let userinfo = text[colon + 1..at].trim_start_matches(['/', '\\', '\t', '\n', '\r']);
    let mut start = at - userinfo.len();
    if keep_user && let Some(end_of_user) = userinfo.find(':') {
        start += end_of_user + 1;
    }
    format!("{}***{}", &text[..start], &text[at..])
}

/// What ends a URL quoted in a message: whitespace (any, ASCII or not), `"`, `<` and `>`, none
/// of which a URL holds but %-encoded.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '<' | '>')
}

/// Punctuation that may close a quoted URL (`'...'`, `(...)`, a full stop): left out of the parse
/// and put back after it. None is `@`, so what is left out lies after the last `@`, where no
/// password is.
const CLOSING: &[char] = &['\'', ')', ']', '}', ',', '.', ';', ':', '!', '?'];

/// Where the scheme that ends `before` starts (letters, digits, `+`, `-`, `.`).
fn scheme_start(before: &str) -> usize {
    before
        .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        .len()
}

/// `text` with the password of every `scheme://user:password@host/...` in it replaced by `***`:
/// for text that may quote URLs among other words (GStreamer's messages, a client's errors). A
/// URL starts at its scheme and ends at whitespace, `"`, `<` or `>` (see [`ends_url`]), so it
/// may be quoted, bracketed or followed by punctuation; each is shown as [`redact`] shows it.
/// A password written with raw whitespace in a URL is not one a message can quote.
pub fn redact_all(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = scheme_start(&rest[..at]);
        let end = rest[at..].find(ends_url).map_or(rest.len(), |e| at + e);
        let url = rest[start..end].trim_end_matches(CLOSING);
        out.push_str(&rest[..start]);
        out.push_str(&redact(url));
        out.push_str(&rest[start + url.len()..end]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passwords with every reserved character, raw and percent-encoded.
    const CORPUS: &[&str] = &[
        "pa#ss1", "pa?ss2", "pa/ss3", "pa@ss4", "pa:ss5", "pa%ss6", "pa ss7", "p%23ss", "p%40ss",
        "p%25ss", "p%20ss", "p%2Fss", "p%3Fss", "hunter2",
        // A port-like start: these parse, as host "admin" and port 12.
        "12#ss8", "12?ss9", "12/ss0",
    ];

    /// Every form a password may take on its way: as written, decoded, encoded by the URL
    /// standard or byte by byte.
    fn forms(password: &str) -> Vec<String> {
        let mut forms = vec![password.to_owned()];
        if let Some(decoded) = crate::spec::percent_decode(password) {
            forms.push(decoded);
        }
        forms.push(utf8_percent_encode(password, USERINFO).to_string());
        forms.push(utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC).to_string());
        forms
    }

    /// Fails when `text` holds any 4-character piece of any form of `password`.
    fn assert_hidden(password: &str, text: &str) {
        for form in forms(password) {
            let chars: Vec<char> = form.chars().collect();
            for piece in chars.windows(4) {
                let piece: String = piece.iter().collect();
                assert!(
                    !text.contains(&piece),
                    "{password:?}: {piece:?} shows in {text:?}"
                );
            }
        }
    }

    #[test]
    fn no_password_of_the_corpus_shows_in_any_spelling() {
        for password in CORPUS {
            for uri in [
                format!("rtsp://admin:{password}@127.0.0.1:9/cam"),
                format!("rtsp://admin:{password}@127.0.0.1:9"),
                format!("rtsp://admin:{password}@cam.lan/x?channel=1"),
                format!("mqtt://admin:{password}@[::1]:1883"),
                format!("http://admin:{password}@h/hook"),
            ] {
                let shown = redact(&uri);
                assert_hidden(password, &shown);
                assert!(shown.contains("***@"), "{uri} -> {shown}");
                if let Err(e) = Address::parse(&uri) {
                    assert_hidden(password, &e.to_string());
                }
            }
        }
    }

    #[test]
    fn a_parsed_url_keeps_user_and_host_and_loses_the_password() {
        assert_eq!(
            redact("rtsp://admin:hunter2@10.0.0.9:554/s?x=1"),
            "rtsp://admin:***@10.0.0.9:554/s?x=1"
        );
        assert_eq!(redact("mqtt://u:p%40ss@h:1883"), "mqtt://u:***@h:1883");
        assert_eq!(redact("rtsp://admin:p@ss@cam/x"), "rtsp://admin:***@cam/x");
        assert_eq!(redact("rtsp://user@cam/x"), "rtsp://user@cam/x");
        assert_eq!(redact("rtsp://cam/x"), "rtsp://cam/x");
        assert_eq!(redact("no url"), "no url");
    }

    #[test]
    fn an_unclear_url_loses_everything_before_its_last_at() {
        // Does not parse: the port would be "pa".
        assert_eq!(
            redact("rtsp://admin:pa#ss@127.0.0.1:9/cam"),
            "rtsp://***@127.0.0.1:9/cam"
        );
        // Parses, as host "admin", port 12: the '@' after the host gives it away.
        assert_eq!(
            redact("rtsp://admin:12?ss@127.0.0.1:9/cam"),
            "rtsp://***@127.0.0.1:9/cam"
        );
        assert_eq!(redact("rtsp://admin:12/s@s@h/cam"), "rtsp://***@h/cam");
        assert_eq!(redact("rtsp://cam/x?a=b@c"), "rtsp://***@c");
    }

    #[test]
    fn every_url_in_a_gstreamer_message_loses_its_password() {
        assert_eq!(
            redact_all("failed: <rtsp://u:pw@cam/x> and (mqtt://v:pw2@h:1) rtsp://w@c/y"),
            "failed: <rtsp://u:***@cam/x> and (mqtt://v:***@h:1) rtsp://w@c/y"
        );
        for written in CORPUS {
            // A URL in a message is a written one: a space in it is %20.
            let password = written.replace(' ', "%20");
            for message in [
                format!(
                    "Could not open resource for reading. rtsp://admin:{password}@127.0.0.1:9/cam"
                ),
                format!(
                    "../gst/rtsp/gstrtspsrc.c(8155): gst_rtspsrc_open (): /GstPipeline:pipeline0/GstRTSPSrc:src:\nFailed to connect. (Generic error) 'rtsp://admin:{password}@127.0.0.1:9/cam'"
                ),
                format!("opening \"rtsp://admin:{password}@127.0.0.1:9\" failed"),
            ] {
                let shown = redact_all(&message);
                assert_hidden(written, &shown);
                assert!(shown.contains("***@127.0.0.1:9"), "{shown}");
            }
        }
        assert_eq!(redact_all("no url here"), "no url here");
        // Multi-byte whitespace and punctuation around a URL.
        assert_eq!(redact_all("x\u{a0}rtsp://a:b@c"), "x\u{a0}rtsp://a:***@c");
        assert_eq!(
            redact_all("\u{3000}«rtsp://a:b@c/x»\u{2003}"),
            "\u{3000}«rtsp://a:***@c/x»\u{2003}"
        );
        assert_eq!(redact_all("é://a:b@c"), "é://***@c");
        assert_eq!(redact_all("a://b://c"), "a://b://c");
    }

    #[test]
    fn percent_encoded_passwords_are_decoded_and_connect_encoded() {
        for (written, decoded) in [
            ("p%23ss", "p#ss"),
            ("p%40ss", "p@ss"),
            ("p%25ss", "p%ss"),
            ("p%20ss", "p ss"),
            ("p%3Fss", "p?ss"),
            ("p%2Fss", "p/ss"),
            ("p@ss", "p@ss"),
            ("p:ss", "p:ss"),
            ("p ss", "p ss"),
        ] {
            let a = Address::parse(&format!("rtsp://ad%20min:{written}@cam:554/x?c=1")).unwrap();
            assert_eq!(a.password().map(Secret::expose), Some(decoded), "{written}");
            assert_eq!(a.user(), "ad min");
            assert_eq!(a.without_credentials().as_str(), "rtsp://cam:554/x?c=1");
            assert_eq!(a.to_string(), "rtsp://ad%20min:***@cam:554/x?c=1");
            let again = Address::parse(&a.expose()).unwrap();
            assert_eq!(again.password(), a.password(), "{}", a.expose());
        }
        let a = Address::parse("rtsp://cam/x").unwrap();
        assert!(!a.has_credentials() && a.password().is_none());
    }

    #[test]
    fn raw_hash_question_mark_slash_and_percent_are_refused_without_the_password() {
        for (uri, want) in [
            ("rtsp://admin:pa#ss@127.0.0.1:9/cam", "invalid port"),
            (
                "rtsp://admin:12#ss@127.0.0.1:9/cam",
                "an '@' after the host",
            ),
            ("rtsp://admin:pa?ss@127.0.0.1:9/cam", "invalid port"),
            (
                "rtsp://admin:12/ss@127.0.0.1:9/cam",
                "an '@' after the host",
            ),
            (
                "rtsp://admin:pa%ss@127.0.0.1:9/cam",
                "bad %-escape in the password",
            ),
            ("rtsp://admin:pass@", "empty host"),
        ] {
            let e = Address::parse(uri).unwrap_err().to_string();
            assert!(e.contains(want), "{uri}: {e}");
            assert!(e.contains("%23"), "{uri}: {e}");
            assert!(!e.contains("ss@") && !e.contains("pass@"), "{uri}: {e}");
        }
    }
}
