//! Passwords: held as a [`Secret`], read from a file, or decoded from a URL's %-escapes (a URL
//! itself is parsed and redacted in `address.rs`). Shared by the source and the network sinks:
//! `Debug` of what holds a password never shows it.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use percent_encoding::{
    AsciiSet, CONTROLS, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode,
};

/// What a decoded password is percent-encoded with to go back into a URL: the WHATWG URL
/// standard's userinfo set (the `url` crate's, which it does not export), plus `%` itself.
pub const USERINFO: &AsciiSet = &CONTROLS
    .add(b'%')
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'/')
    .add(b':')
    .add(b';')
    .add(b'=')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'|');

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

    /// `text` with this password replaced by `***`: as it is, %-decoded, and %-encoded as a URL
    /// holds it (the URL standard's way, and every byte but letters and digits).
    pub fn scrub(&self, text: &str) -> String {
        let p = &self.0;
        if p.is_empty() {
            return text.to_owned();
        }
        let mut forms = vec![
            p.clone(),
            utf8_percent_encode(p, USERINFO).to_string(),
            utf8_percent_encode(p, NON_ALPHANUMERIC).to_string(),
        ];
        forms.extend(percent_decode(p));
        // Longest first, so that a form holding another goes whole.
        forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
        forms.iter().fold(text.to_owned(), |out, form| {
            out.replace(form.as_str(), "***")
        })
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `%41` -> `A`; `None` for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let whole = |after: &str| {
        after
            .get(..2)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if !s.split('%').skip(1).all(whole) {
        return None;
    }
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(Cow::into_owned)
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
    fn scrub_removes_every_spelling() {
        let s = Secret::new("p%40ss".into());
        assert_eq!(s.scrub("bad p%40ss or p@ss"), "bad *** or ***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(percent_decode("%+1"), None);
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%25%41"), Some("a%A".to_owned()));
        let s = Secret::new("p#s s".into());
        assert_eq!(s.scrub("p#s s, p%23s%20s, p%23s%20s"), "***, ***, ***");
    }
}
