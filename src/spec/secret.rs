//! Passwords: in a URL (`scheme://user:password@host/...`), in a file, or held as a [`Secret`].
//! Shared by the source and the network sinks, so that every message that may quote a URL
//! redacts it the same way: `Display`/`Debug` of what holds a password never show it.

use std::fmt;
use std::path::{Path, PathBuf};

/// A password that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with this password (and its %-decoded form) replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let p = &self.0;
        if p.is_empty() {
            return text.to_owned();
        }
        let mut out = text.replace(p.as_str(), "***");
        if let Some(decoded) = percent_decode(p).filter(|d| d != p) {
            out = out.replace(&decoded, "***");
        }
        out
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Replaces the password of `scheme://user:password@host/...` with `***`.
pub fn redact(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => uri.to_owned(),
    }
}

/// `text` with the password of every `scheme://user:password@host/...` in it replaced by `***`:
/// for text that may quote URLs among other words (GStreamer's messages).
pub fn redact_all(text: &str) -> String {
    let delimiter = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '(' | ')');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at].rfind(delimiter).map_or(0, |d| d + 1);
        let end = rest[at..].find(delimiter).map_or(rest.len(), |e| at + e);
        out.push_str(&rest[..start]);
        out.push_str(&redact(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The user and password of `scheme://user:password@host`, as written (%-escaped), if any.
pub fn url_credentials(uri: &str) -> Option<(&str, Option<&str>)> {
    let rest = uri.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = authority.rsplit_once('@')?.0;
    Some(match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    })
}

/// `%41` -> `A`; `None` for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Reads a password file (its trailing newline removed). A relative path is looked up in
/// systemd's `$CREDENTIALS_DIRECTORY` when that is set (`LoadCredential=`).
pub fn read_password_file(path: &Path) -> Result<String, String> {
    let full: PathBuf = match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) if path.is_relative() => Path::new(&dir).join(path),
        _ => path.to_owned(),
    };
    std::fs::read_to_string(&full)
        .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
        .map_err(|e| format!("cannot read password file \"{}\": {e}", full.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_only_their_password() {
        assert_eq!(redact("mqtt://u:hunter2@h:1883"), "mqtt://u:***@h:1883");
        assert_eq!(redact("rtsp://cam/x?a=b@c"), "rtsp://cam/x?a=b@c");
        assert_eq!(
            url_credentials("mqtt://u:p%40ss@h"),
            Some(("u", Some("p%40ss")))
        );
        assert_eq!(url_credentials("mqtt://u@h"), Some(("u", None)));
        assert_eq!(url_credentials("mqtt://h"), None);
    }

    #[test]
    fn every_url_in_a_text_loses_its_password() {
        assert_eq!(
            redact_all("failed: <rtsp://u:pw@cam/x> and (mqtt://v:pw2@h:1) rtsp://w@c/y"),
            "failed: <rtsp://u:***@cam/x> and (mqtt://v:***@h:1) rtsp://w@c/y"
        );
        assert_eq!(redact_all("no url here"), "no url here");
        assert_eq!(redact_all("a://b://c"), "a://b://c");
    }

    #[test]
    fn scrub_removes_both_spellings() {
        let s = Secret::new("p%40ss".into());
        assert_eq!(s.scrub("bad p%40ss or p@ss"), "bad *** or ***");
        assert_eq!(format!("{s:?}"), "***");
    }
}
