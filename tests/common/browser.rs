//! A real browser for the page's tests: Debian's `chromium`, headless, driven over CDP by
//! `headless_chrome`; reading values out of the page, waiting for them, and keeping screenshots
//! in `target/tmp/page/` (CARGO_TARGET_TMPDIR).
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

/// Guards against a hang only.
pub const DEADLINE: Duration = Duration::from_secs(180);

/// A browser with a window of `width` x `height` CSS pixels.
pub fn browser(width: u32, height: u32) -> Browser {
    let args: Vec<&OsStr> = vec![OsStr::new("--autoplay-policy=no-user-gesture-required")];
    Browser::new(
        LaunchOptions::default_builder()
            .path(Some(PathBuf::from("/usr/bin/chromium")))
            .headless(true)
            .sandbox(false)
            .window_size(Some((width, height)))
            .idle_browser_timeout(DEADLINE)
            .args(args)
            .build()
            .unwrap(),
    )
    .expect("chromium (Debian package chromium, installed by scripts/install-deps)")
}

/// The value of `expr` in the page.
pub fn js(tab: &Tab, expr: &str) -> serde_json::Value {
    tab.evaluate(&format!("JSON.stringify({expr})"), true)
        .unwrap()
        .value
        .and_then(|v| v.as_str().and_then(|s| serde_json::from_str(s).ok()))
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until `expr` is truthy in the page; its value.
pub fn wait_js(tab: &Tab, what: &str, expr: &str) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let v = js(tab, expr);
        if !(v.is_null() || v == false || v == 0 || v == "") {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "{what}: never ({expr})");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Keeps a screenshot of the tab as `target/tmp/page/NAME`.
pub fn screenshot(tab: &Tab, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("page");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
    path
}
