//! The redactor and the URL parser (`spec::redact`, `spec::redact_all`, `spec::Address`) fuzzed
//! with arbitrary Unicode: they never panic on any text (GStreamer's log callback, a C callback,
//! hands `redact_all` whatever an element printed: a panic there aborts the daemon), they never
//! show a password in any spelling they promise to catch, and showing twice is showing once.
//!
//! What each promises:
//! - `redact` and `Address`: a URL as a user wrote it, any password (raw, %-encoded, with
//!   reserved or non-ASCII characters) and any user, host and rest;
//! - `redact_all`: such a URL quoted in a message the way a URL is written (the user and
//!   password %-encoded as the URL standard writes them), quoted, bracketed or bare, between any
//!   words.
//!
//! Spellings: the password as written, %-decoded, %-encoded as the URL standard and the `url`
//! crate write it, and every byte but letters and digits %-encoded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;
use url::Url;
use vidflow::spec::{Address, URL_ADVICE, USERINFO, percent_decode, redact, redact_all};

/// Characters that matter to a URL or to the redactor, many of them multi-byte.
const SPECIAL: &[char] = &[
    ':',
    '/',
    '@',
    '%',
    '#',
    '?',
    '\\',
    '.',
    '*',
    '+',
    '-',
    ' ',
    '\t',
    '\n',
    '\r',
    '"',
    '\'',
    '(',
    ')',
    '<',
    '>',
    '[',
    ']',
    '{',
    '}',
    ',',
    ';',
    '!',
    '\u{a0}',
    '\u{2003}',
    '\u{3000}',
    '\u{2028}',
    '\u{85}',
    '\u{feff}',
    'é',
    '«',
    '»',
    '\u{1f600}',
    '\0',
];

/// Pieces that make a URL-like text.
const PIECES: &[&str] = &[
    "://",
    "rtsp",
    "http",
    "mqtt",
    "a:b@c",
    "%40",
    "%25",
    "%3A",
    "%",
    "%zz",
    "%c3%a9",
    "@",
    ":",
    "//",
    "\\\\",
    "rtsp://u:p@h",
    "***",
];

fn one_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => any::<char>(),
        4 => prop::sample::select(SPECIAL),
        3 => prop::char::range('a', 'z'),
        1 => prop::char::range('0', '9'),
    ]
}

/// Arbitrary Unicode, weighted toward what a URL and the redactor care about.
fn messy(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => one_char().prop_map(String::from),
            1 => prop::sample::select(PIECES).prop_map(str::to_owned),
        ],
        0..max,
    )
    .prop_map(|pieces| pieces.concat())
}

/// A password: arbitrary Unicode, at least 3 characters so that its spellings are its own.
fn password() -> impl Strategy<Value = String> {
    prop::collection::vec(one_char(), 3..12).prop_map(|c| c.into_iter().collect())
}

fn scheme() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "rtsp", "rtsps", "mqtt", "http", "https", "ws", "file", "x-y.z+1"
            ][..]
        )
        .prop_map(str::to_owned),
        "[a-zA-Z][a-zA-Z0-9+.-]{0,6}",
    ]
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(
            &["cam", "127.0.0.1:9", "[::1]:554", "cam.lan", "h:554", "xn--caf-dma", "café"][..]
        )
        .prop_map(str::to_owned),
        1 => messy(6),
    ]
}

/// What follows the host: a path, query or fragment, or anything.
fn tail() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        messy(12).prop_map(|t| format!("/{t}")),
        messy(12).prop_map(|t| format!("?{t}")),
        messy(12).prop_map(|t| format!("#{t}")),
        messy(12),
    ]
}

/// Every spelling of `password` the redactor promises to hide.
fn spellings(password: &str) -> Vec<String> {
    let mut forms = vec![
        password.to_owned(),
        utf8_percent_encode(password, USERINFO).to_string(),
        utf8_percent_encode(password, NON_ALPHANUMERIC).to_string(),
    ];
    forms.extend(percent_decode(password));
    let mut url = Url::parse("x://u@h").unwrap();
    url.set_password(Some(password)).unwrap();
    forms.extend(url.password().map(str::to_owned));
    forms.retain(|f| !f.is_empty());
    forms.dedup();
    forms
}

/// The spelling of `password` that shows in `text`, if one does.
fn shown(password: &str, text: &str) -> Option<String> {
    spellings(password).into_iter().find(|f| text.contains(f))
}

/// Rejects a case where a spelling of the password is also in text around it (a user or host
/// that holds it, or "***" followed by what the password is made of): there it shows whatever
/// the redactor does.
fn distinct(password: &str, around: &[&str]) -> bool {
    around.iter().all(|t| shown(password, t).is_none())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_global_rejects: 4096, ..ProptestConfig::default() })]

    /// No text makes them panic, and showing twice is showing once.
    #[test]
    fn any_text_is_shown_without_a_panic_and_once_is_enough(text in messy(40)) {
        let once = redact(&text);
        prop_assert_eq!(redact(&once), once.clone());
        let once_all = redact_all(&text);
        prop_assert_eq!(redact_all(&once_all), once_all.clone());
        if let Ok(a) = Address::parse(&text) {
            prop_assert_eq!(a.to_string(), once);
        }
    }

    /// A URL as a user wrote it: any password, raw or %-encoded, never shows, in any spelling,
    /// in `redact`, in what an `Address` shows, or in its error.
    #[test]
    fn a_written_password_never_shows(
        scheme in scheme(),
        // What a URL parser takes for "://": http:user:pw@host is a URL with a password.
        sep in prop::sample::select(&["://", "://", "://", ":", ":/", ":///", ":\\\\", ":/\t/", "://\n"][..]),
        user in messy(6),
        password in password(),
        host in host(),
        tail in tail(),
    ) {
        let uri = format!("{scheme}{sep}{user}:{password}@{host}{tail}");
        let plain = format!("{scheme}{sep}{user}:x@{host}{tail}");
        prop_assume!(distinct(&password, &[
            &redact(&plain),
            &format!("{scheme}{sep}***@{host}{tail}"),
            &format!("{scheme}{sep}{user}:***@{host}{tail}"),
            // An error's fixed advice ("write '#', '?', '/' ..."): " '/" is a password, and in it.
            URL_ADVICE,
        ]));
        let redacted = redact(&uri);
        prop_assert_eq!(shown(&password, &redacted), None, "{:?} -> {:?}", uri, redacted);
        prop_assert_eq!(redact(&redacted), redacted.clone());
        match Address::parse(&uri) {
            Ok(a) => {
                prop_assert_eq!(shown(&password, &a.to_string()), None);
                prop_assert_eq!(shown(&password, &format!("{a:?}")), None);
                // What connects is the same URL: parsed again, the same credentials.
                let again = Address::parse(&a.expose()).unwrap();
                prop_assert_eq!(again.password(), a.password());
                prop_assert_eq!(again.user(), a.user());
                prop_assert_eq!(again.without_credentials(), a.without_credentials());
            }
            Err(e) => prop_assert_eq!(shown(&password, &e.to_string()), None, "{}", e),
        }
    }

    /// A URL quoted in a message, user and password written as a URL writes them, bare, quoted
    /// or bracketed, between any words: its password never shows in any spelling.
    #[test]
    fn a_quoted_password_never_shows(
        before in messy(12),
        scheme in scheme(),
        user in messy(6),
        password in password(),
        host in prop::sample::select(&["cam", "127.0.0.1:9", "[::1]:554", "cam.lan"][..]),
        path in "(/[a-z0-9._~-]{0,8}){0,3}",
        quotes in prop::sample::select(&[("", ""), ("'", "'"), ("(", ")"), ("<", ">"), ("\"", "\""), ("", "."), ("«", "»")][..]),
        space in prop::sample::select(&[" ", "\u{a0}", "\u{3000}", "\n", "\t"][..]),
        after in messy(12),
    ) {
        let user = utf8_percent_encode(&user, USERINFO).to_string();
        let written = utf8_percent_encode(&password, USERINFO).to_string();
        let url = format!("{scheme}://{user}:{written}@{host}{path}");
        let (open, close) = quotes;
        let message = format!("{before}{space}{open}{url}{close}{space}{after}");
        prop_assume!(distinct(&password, &[&before, &after, &user, &redact(&url)]));
        prop_assume!(distinct(&password, &[&redact_all(&format!("{before}{space}{open}{scheme}://{user}:x@{host}{path}{close}{space}{after}"))]));
        let redacted = redact_all(&message);
        prop_assert_eq!(shown(&password, &redacted), None, "{:?} -> {:?}", message, redacted);
        prop_assert!(redacted.contains("***@"), "{:?} -> {:?}", message, redacted);
        prop_assert_eq!(redact_all(&redacted), redacted.clone());
    }
}

/// The case the issue found: a multi-byte space before a URL made `redact_all` slice inside it.
#[test]
fn a_multi_byte_space_before_a_url_is_stepped_over() {
    assert_eq!(redact_all("x\u{a0}rtsp://a:b@c"), "x\u{a0}rtsp://a:***@c");
    assert_eq!(redact("x\u{a0}rtsp://a:b@c"), "x\u{a0}rtsp://***@c");
}
