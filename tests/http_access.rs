//! Who the HTTP endpoint answers, on a real `vidflow` process: a request naming a foreign
//! `Host` (a DNS-rebinding page) is refused, and with `[http] token_file` or basic auth set
//! every page but `/healthz` needs the credentials. Basic auth's password is an Argon2 hash
//! made by the real `vidflow hash-password`; the deprecated SHA-256 still lets a user in, with
//! a warning. Meanwhile `/healthz` answers a good client within 1 s, and the refused clients
//! leave no thread or file descriptor behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{Running, free_port, spawn, vidflow, write};
use http_client::{
    Load, assert_healthz_answers_quickly, load, request, wait_for_baseline, wait_until,
};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);
/// `printf %s hunter2 | sha256sum`
const HUNTER2_SHA256: &str = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
/// `ops:hunter2` in base64.
const OPS_HUNTER2: &str = "b3BzOmh1bnRlcjI=";

/// A live source with a preview sink and the endpoint with `http_extra` in `[http]`; the
/// environment gives `CREDENTIALS_DIRECTORY`. Returns once `/healthz` answers, with the load.
fn start(dir: &Path, http_extra: &str) -> (Running, u16, Load) {
    let port = free_port();
    let p = write(
        dir,
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=10\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n{http_extra}\n\
             [sinks.watch]\nkind = \"preview\"\nimage = \"$frame\"\n"
        ),
    );
    let credentials = dir.join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::write(credentials.join("http-token"), "t0ken-of-the-day\n").unwrap();
    let run = spawn(
        dir,
        &["run", p.to_str().unwrap()],
        &[("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap())],
    );
    // The baseline once frames flow (the pipeline's threads have all started); the token is
    // ignored where none is asked for.
    wait_until("frames flowing", DEADLINE, || {
        let (status, _, body) = request(
            port,
            "GET /stats.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer t0ken-of-the-day\r\n\r\n",
        )?;
        assert_eq!(status, 200, "{body}");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        (stats["sources"][0]["decoded"].as_u64()? >= 5).then_some(())
    });
    let baseline = load(run.pid());
    (run, port, baseline)
}

/// `GET path` with these extra header lines (each ending in CRLF): the status and headers.
fn status(port: u16, path: &str, headers: &str) -> (u16, Vec<String>) {
    let (status, headers, _) =
        request(port, &format!("GET {path} HTTP/1.1\r\n{headers}\r\n")).unwrap();
    (status, headers)
}

#[test]
fn a_foreign_host_is_refused_421_and_loopback_names_and_allowed_hosts_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port, baseline) = start(dir.path(), "allowed_hosts = [\"cams.example\"]");
    for path in ["/stats.json", "/preview/cam", "/metrics", "/"] {
        let host = format!("Host: rebound.example:{port}\r\n");
        assert_eq!(status(port, path, &host).0, 421, "{path}");
        assert_healthz_answers_quickly(port);
    }
    assert_eq!(status(port, "/stats.json", "").0, 400, "no Host");
    for host in [
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "cams.example".to_owned(),
    ] {
        let (code, _) = status(port, "/stats.json", &format!("Host: {host}\r\n"));
        assert_eq!(code, 200, "{host}");
    }
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    run.terminate_cleanly(DEADLINE);
}

/// `vidflow hash-password` given `password` on its standard input (as `echo` would).
fn hash_password(password: &str) -> String {
    let mut child = vidflow()
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(!hash.contains(password), "{hash}");
    hash
}

#[test]
fn with_a_token_and_basic_auth_pages_need_credentials_and_healthz_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let hash = hash_password("hunter2");
    // A fresh salt each time: the same password, another hash.
    assert_ne!(hash, hash_password("hunter2"));
    let (run, port, baseline) = start(
        dir.path(),
        &format!(
            "token_file = \"http-token\"\nbasic_user = \"ops\"\n\
             basic_password_hash = \"{hash}\""
        ),
    );
    let host = "Host: 127.0.0.1\r\n";
    for path in ["/metrics", "/stats.json", "/preview/cam", "/"] {
        let (code, headers) = status(port, path, host);
        assert_eq!(code, 401, "{path} without credentials");
        assert!(
            headers
                .iter()
                .any(|h| h.starts_with("WWW-Authenticate: Bearer"))
                && headers
                    .iter()
                    .any(|h| h.starts_with("WWW-Authenticate: Basic")),
            "{headers:?}"
        );
        for wrong in [
            "Authorization: Bearer t0ken-of-the-da\r\n",
            "Authorization: Bearer hunter2\r\n",
            "Authorization: Basic b3BzOmh1bnRlcjM=\r\n",
        ] {
            assert_eq!(
                status(port, path, &format!("{host}{wrong}")).0,
                401,
                "{wrong}"
            );
        }
        assert_healthz_answers_quickly(port);
    }
    let bearer = format!("{host}Authorization: Bearer t0ken-of-the-day\r\n");
    assert_eq!(status(port, "/metrics", &bearer).0, 200);
    let basic = format!("{host}Authorization: Basic {OPS_HUNTER2}\r\n");
    assert_eq!(status(port, "/stats.json", &basic).0, 200);
    assert_eq!(status(port, "/preview/nope", &basic).0, 404);
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    assert!(!run.stderr().contains("deprecated"), "{}", run.stderr());
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_deprecated_sha256_password_still_lets_the_user_in_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port, _) = start(
        dir.path(),
        &format!(
            "token_file = \"http-token\"\nbasic_user = \"ops\"\n\
             basic_password_sha256 = \"{HUNTER2_SHA256}\""
        ),
    );
    let host = "Host: 127.0.0.1\r\n";
    assert_eq!(status(port, "/metrics", host).0, 401);
    let wrong = format!("{host}Authorization: Basic b3BzOmh1bnRlcjM=\r\n");
    assert_eq!(status(port, "/metrics", &wrong).0, 401);
    let basic = format!("{host}Authorization: Basic {OPS_HUNTER2}\r\n");
    assert_eq!(status(port, "/metrics", &basic).0, 200);
    let stderr = run.stderr();
    assert!(
        stderr.contains("basic_password_sha256 is deprecated")
            && stderr.contains("vidflow hash-password"),
        "{stderr}"
    );
    run.terminate_cleanly(DEADLINE);
}
