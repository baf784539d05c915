//! One purge pass over 100,000 kept segments (real empty files in a temporary folder, indexed
//! through the storage's own API), against a baseline measured in the same run: listing and
//! stat-ing that folder, which is what a purger working from a directory scan does each pass.
//! Also: loading the index of 100,000 files (a restart), a pass that deletes its budget, and
//! starting a file under a cap (checked against it; over it, a pass first).
//!
//!     cargo bench --bench purge
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use vidflow::storage::{
    Class, FilePolicy, PASS_BUDGET, Retention, Storage, StorageConfig, SystemClock,
};

/// Files indexed: 100,000 under `cargo bench`; a few under `cargo test`, which runs this
/// without `--bench` to check that it works (nothing timed then).
fn files() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        100_000
    } else {
        2_000
    }
}

fn policy(max_bytes: Option<u64>) -> FilePolicy {
    FilePolicy {
        class: Class::Continuous,
        retention: Retention {
            max_age: Some(Duration::from_secs(86_400 * 365)),
            max_bytes,
        },
        expected_file: 0,
    }
}

/// The fastest of `n` runs of `f`.
fn best(n: usize, mut f: impl FnMut()) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn main() {
    #[expect(non_snake_case, reason = "read as the constant it is within a run")]
    let FILES = files();
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let files = storage.sink("rec", policy(None));
    let t = Instant::now();
    for n in 0..FILES {
        let path = dir.path().join(format!("cam-{n:08}.mp4"));
        let writing = files.create(&path, "cam").unwrap();
        std::fs::write(&path, b"x").unwrap();
        drop(writing);
    }
    println!(
        "indexed {FILES} files in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let scan = best(5, || {
        let mut bytes = 0;
        for e in std::fs::read_dir(dir.path()).unwrap() {
            bytes += e.unwrap().metadata().unwrap().len();
        }
        assert!(bytes >= FILES as u64);
    });
    let pass = best(5, || {
        let p = storage.pass();
        assert_eq!(p.files, 0);
    });
    println!(
        "pass over {FILES} kept files, nothing due: {:.2} ms; directory scan (baseline): {:.2} ms; ratio {:.2}x",
        pass.as_secs_f64() * 1e3,
        scan.as_secs_f64() * 1e3,
        pass.as_secs_f64() / scan.as_secs_f64()
    );
    storage.stop();

    // A restart: the index is read and every listed file's size taken.
    let again = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let t = Instant::now();
    let files = again.sink("rec", policy(None));
    let probe = |name: &str, files: &vidflow::storage::SinkFiles| {
        drop(files.create(&dir.path().join(name), "cam").unwrap());
    };
    probe("probe-0.mp4", &files);
    let load = t.elapsed();
    // A file started under a cap is checked against it (every kept file of its sink and
    // source is counted); over it, a pass makes room before the file is created.
    let files = again.sink("rec", policy(Some(10 * FILES as u64)));
    let mut n = 0;
    let mut next = || {
        n += 1;
        format!("probe-{n}.mp4")
    };
    let room = best(5, || probe(&next(), &files));
    // Over the cap by half the files: each pass (or file started) deletes its budget.
    let files = again.sink("rec", policy(Some((FILES / 2) as u64)));
    let mut deleted = 0;
    let deleting = best(5, || deleted = again.pass().files);
    let over = best(5, || probe(&next(), &files));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let x = |d: Duration| d.as_secs_f64() / scan.as_secs_f64();
    println!(
        "index load of {FILES} files: {:.1} ms ({:.2}x the scan); a pass deleting {} files (budget {PASS_BUDGET}): {:.2} ms ({:.2}x the scan)",
        ms(load),
        x(load),
        deleted,
        ms(deleting),
        x(deleting)
    );
    println!(
        "a file started under a cap with room: {:.2} ms ({:.3}x the scan); over the cap (a pass makes room first): {:.2} ms ({:.2}x the scan)",
        ms(room),
        x(room),
        ms(over),
        x(over)
    );
    again.stop();
}
