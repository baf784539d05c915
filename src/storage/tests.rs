//! Retention over real files in a temporary folder, with an injected clock.

use std::sync::atomic::AtomicU64;

use super::*;

const DAY: u64 = 86_400_000;

/// A clock the test moves by hand (milliseconds since the epoch).
#[derive(Debug)]
struct Manual(AtomicU64);

impl Clock for Manual {
    fn now(&self) -> SystemTime {
        index::from_millis(self.0.load(Ordering::Relaxed))
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    clock: Arc<Manual>,
    storage: Storage,
}

impl Fixture {
    fn new(config: StorageConfig) -> Self {
        let clock = Arc::new(Manual(AtomicU64::new(1_800_000_000_000)));
        let storage = Storage::start(config, clock.clone()).unwrap();
        Self {
            dir: tempfile::tempdir().unwrap(),
            clock,
            storage,
        }
    }

    fn advance(&self, ms: u64) {
        self.clock.0.fetch_add(ms, Ordering::Relaxed);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// (The storage thread may run a pass between two steps of a test, so tests look at files
    /// and totals after an explicit pass, never at what one pass returned.)
    /// Writes a finished file of `bytes` through `files`, then moves the clock a second on.
    fn write(&self, files: &SinkFiles, name: &str, bytes: usize) {
        let writing = files.create(&self.path(name), "door").unwrap();
        std::fs::write(self.path(name), vec![7u8; bytes]).unwrap();
        drop(writing);
        self.advance(1_000);
    }

    fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.storage.stop();
    }
}

fn policy(class: Class, retain_days: Option<u64>, max_bytes: Option<u64>) -> FilePolicy {
    FilePolicy {
        class,
        retention: Retention {
            max_age: retain_days.map(|d| Duration::from_secs(d * 86_400)),
            max_bytes,
        },
        expected_file: 0,
    }
}

#[test]
fn files_older_than_retain_days_go_and_younger_ones_stay() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, Some(7), None));
    f.write(&rec, "old.mp4", 10);
    f.advance(3 * DAY);
    f.write(&rec, "young.mp4", 10);
    f.advance(4 * DAY + 1);
    f.storage.pass();
    assert!(!f.exists("old.mp4"));
    assert!(f.exists("young.mp4"));
    assert_eq!(f.storage.report().sinks["rec"].purged_files, 1);
}

#[test]
fn a_sink_over_max_gb_loses_its_oldest_files_never_the_one_being_written() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, None, Some(250)));
    for n in 0..4 {
        f.write(&rec, &format!("{n}.mp4"), 100);
    }
    let writing = rec.create(&f.path("4.mp4"), "door").unwrap();
    std::fs::write(f.path("4.mp4"), vec![0u8; 300]).unwrap();
    f.storage.pass();
    // The open file alone is over the cap: every finished file goes, the open one stays.
    for n in 0..4 {
        assert!(!f.exists(&format!("{n}.mp4")), "{n}.mp4 kept");
    }
    assert!(f.exists("4.mp4"));
    drop(writing);
    f.write(&rec, "5.mp4", 100);
    f.storage.pass();
    assert!(
        !f.exists("4.mp4"),
        "the finished 300-byte file is over the cap"
    );
    assert!(f.exists("5.mp4"));
    let totals = f.storage.report().sinks["rec"];
    assert_eq!((totals.kept_files, totals.kept_bytes), (1, 100));
    assert_eq!((totals.purged_files, totals.purged_bytes), (5, 700));
}

#[test]
fn files_vidflow_did_not_write_survive_every_purge() {
    let f = Fixture::new(StorageConfig {
        floor: Floor {
            min_free_bytes: None,
            min_free_percent: Some(100.0),
        },
        ..StorageConfig::default()
    });
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, Some(1), Some(1)));
    // A user's files, one named like a segment, one in a folder of its own.
    std::fs::write(f.path("notes.txt"), "mine").unwrap();
    std::fs::write(f.path("seg-20261202T000000Z.mp4"), "mine too").unwrap();
    std::fs::create_dir(f.path("keep")).unwrap();
    std::fs::write(f.path("keep/x.mp4"), "mine").unwrap();
    f.write(&rec, "seg-1.mp4", 10);
    f.advance(10 * DAY);
    f.storage.pass();
    let sink = f.storage.report().sinks["rec"];
    assert!(!f.exists("seg-1.mp4"));
    assert_eq!(sink.purged_files, 1);
    for foreign in ["notes.txt", "seg-20261202T000000Z.mp4", "keep/x.mp4"] {
        assert!(f.exists(foreign), "{foreign} was deleted");
    }
}

#[test]
fn under_a_source_cap_continuous_footage_goes_before_older_event_clips() {
    let f = Fixture::new(StorageConfig {
        sources: HashMap::from([(
            "door".to_owned(),
            Retention {
                max_age: None,
                max_bytes: Some(15),
            },
        )]),
        ..StorageConfig::default()
    });
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    let clips = f.storage.sink("clips", policy(Class::Event, None, None));
    f.write(&clips, "event-old.mp4", 10);
    f.write(&rec, "cont-1.mp4", 10);
    f.write(&rec, "cont-2.mp4", 10);
    f.storage.pass();
    assert!(
        f.exists("event-old.mp4"),
        "the event clip went before continuous footage"
    );
    assert!(!f.exists("cont-1.mp4") && !f.exists("cont-2.mp4"));
}

#[test]
fn under_a_free_space_floor_every_kept_file_but_the_open_one_may_go() {
    // A floor no filesystem can meet.
    let f = Fixture::new(StorageConfig {
        floor: Floor {
            min_free_bytes: Some(u64::MAX),
            min_free_percent: None,
        },
        ..StorageConfig::default()
    });
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    let log = f.storage.sink("log", policy(Class::Log, None, None));
    f.write(&log, "events.1.jsonl", 10);
    f.write(&rec, "cont-1.mp4", 10);
    let writing = rec.create(&f.path("cont-2.mp4"), "door").unwrap();
    std::fs::write(f.path("cont-2.mp4"), "being written").unwrap();
    f.storage.pass();
    assert!(!f.exists("events.1.jsonl") && !f.exists("cont-1.mp4"));
    assert!(f.exists("cont-2.mp4"));
    let space = &f.storage.report().filesystems[0];
    assert!(space.size_bytes > 0 && space.free_bytes <= space.size_bytes);
    // The space is read when asked for, not when the last pass ran.
    let before = f.storage.report().filesystems[0].free_bytes;
    std::fs::write(f.path("big"), vec![1u8; 8 << 20]).unwrap();
    std::fs::File::open(f.path("big"))
        .unwrap()
        .sync_all()
        .unwrap();
    let after = f.storage.report().filesystems[0].free_bytes;
    assert!(after < before, "{after} of {before}");
    drop(writing);
}

#[test]
fn a_restarted_storage_goes_on_purging_the_files_of_the_earlier_run_from_its_index() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    f.write(&rec, "a.mp4", 100);
    // Killed while writing b.mp4: its Writing never dropped (no close line).
    std::mem::forget(rec.create(&f.path("b.mp4"), "door").unwrap());
    std::fs::write(f.path("b.mp4"), vec![0u8; 100]).unwrap();
    std::fs::write(f.path("c.mp4"), vec![0u8; 100]).unwrap(); // not ours
    f.storage.stop();

    let again = Storage::start(StorageConfig::default(), f.clock.clone()).unwrap();
    let rec = again.sink("rec", policy(Class::Continuous, None, Some(150)));
    f.write(&rec, "d.mp4", 100);
    again.pass();
    again.stop();
    assert!(
        !f.exists("a.mp4") && !f.exists("b.mp4"),
        "the earlier run's files kept"
    );
    assert!(f.exists("c.mp4") && f.exists("d.mp4"));
}

#[test]
fn without_a_policy_a_full_disk_deletes_nothing() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    f.write(&rec, "a.mp4", 100);
    assert_eq!(rec.disk_full(&f.path("b.mp4")), 0);
    assert!(f.exists("a.mp4"));
    assert_eq!(f.storage.report().sinks["rec"].disk_full, 1);
}

#[test]
fn with_a_policy_a_full_disk_deletes_the_oldest_footage_to_make_room() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, Some(30), None));
    f.write(&rec, "a.mp4", 100);
    f.write(&rec, "b.mp4", 100);
    let writing = rec.create(&f.path("c.mp4"), "door").unwrap();
    // The room asked for is far more than this folder holds: all but the open file go.
    assert_eq!(rec.disk_full(&f.path("c.mp4")), 200);
    assert!(!f.exists("a.mp4") && !f.exists("b.mp4"));
    drop(writing);
}

#[test]
fn retain_days_and_max_gb_are_checked_with_their_place() {
    let spanned = |v: f64| Spanned::new(3..7, v);
    let e = Retention::parse(Some(spanned(0.0)), None, None).unwrap_err();
    assert!(
        e.message.contains("retain_days must be more than 0"),
        "{}",
        e.message
    );
    let e = Retention::parse(Some(spanned(-1.0)), None, None).unwrap_err();
    assert_eq!(e.span, Some(3..7));
    let e = Retention::parse(None, Some(spanned(0.001)), Some((2_000_000, "segment"))).unwrap_err();
    assert!(
        e.message.contains("smaller than one segment"),
        "{}",
        e.message
    );
    let ok = Retention::parse(
        Some(spanned(1.5)),
        Some(spanned(0.01)),
        Some((2_000_000, "segment")),
    )
    .unwrap();
    assert_eq!(ok.max_bytes, Some(10_000_000));
    assert_eq!(ok.max_age, Some(Duration::from_secs(129_600)));
}

#[test]
fn a_file_growing_into_the_room_under_a_cap_wakes_a_pass_before_the_next_file_starts() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, None, Some(1_000)));
    for n in 0..3 {
        f.write(&rec, &format!("{n}.mp4"), 300);
    }
    let writing = rec.create(&f.path("3.mp4"), "door").unwrap();
    // The pass that file's start asked for has run (it waits out PASS_GAP at most).
    std::thread::sleep(PASS_GAP + Duration::from_millis(300));
    f.storage.pass();
    assert!(
        f.exists("0.mp4"),
        "900 + an empty open file is under the cap"
    );
    // It grows by more than the room left; nothing else happens (no file starts or ends).
    std::fs::write(f.path("3.mp4"), vec![0u8; 250]).unwrap();
    let start = std::time::Instant::now();
    while f.exists("0.mp4") && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !f.exists("0.mp4"),
        "no pass ran as the open file grew past the cap"
    );
    assert!(f.exists("1.mp4") && f.exists("3.mp4"));
    drop(writing);
}

#[test]
fn a_second_storage_on_a_folder_in_use_indexes_nothing_there_so_it_deletes_nothing() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    f.write(&rec, "a.mp4", 100);
    // The first one is writing b.mp4 when the same pipeline is started a second time.
    let writing = rec.create(&f.path("b.mp4"), "door").unwrap();
    std::fs::write(f.path("b.mp4"), vec![0u8; 100]).unwrap();
    let twin = Storage::start(StorageConfig::default(), f.clock.clone()).unwrap();
    let rec2 = twin.sink("rec", policy(Class::Continuous, None, Some(1)));
    let refused = rec2.create(&f.path("c.mp4"), "door").unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("in use by another vidflow process"),
        "{refused}"
    );
    twin.pass();
    assert!(
        f.exists("a.mp4") && f.exists("b.mp4"),
        "the twin deleted its files"
    );
    twin.stop();
    drop(writing);
    // Once the first has stopped, the folder can be taken over.
    f.storage.stop();
    let next = Storage::start(StorageConfig::default(), f.clock.clone()).unwrap();
    let rec3 = next.sink("rec", policy(Class::Continuous, None, Some(150)));
    f.write(&rec3, "d.mp4", 100);
    next.pass();
    next.stop();
    assert!(!f.exists("a.mp4") && !f.exists("b.mp4") && f.exists("d.mp4"));
}

#[test]
fn a_file_that_starts_over_a_cap_has_room_made_before_it_starts_not_a_pass_gap_later() {
    let f = Fixture::new(StorageConfig::default());
    let mut capped = policy(Class::Continuous, None, Some(800));
    capped.expected_file = 300;
    let rec = f.storage.sink("rec", capped);
    f.write(&rec, "0.mp4", 200);
    f.write(&rec, "1.mp4", 200);
    let a = rec.create(&f.path("2.mp4"), "door").unwrap();
    f.storage.pass();
    assert!(f.exists("0.mp4"), "400 + 0 + 300 expected is under 800");
    // The segment ends at 250 bytes and the next one starts, all within a PASS_GAP of the
    // last pass: 650 finished + 300 expected is over the cap before the new file has a byte.
    std::fs::write(f.path("2.mp4"), vec![0u8; 250]).unwrap();
    drop(a);
    let b = rec.create(&f.path("3.mp4"), "door").unwrap();
    assert!(!f.exists("0.mp4"), "the new segment started over the cap");
    std::fs::write(f.path("3.mp4"), vec![0u8; 250]).unwrap();
    let kept: u64 = (0..4)
        .filter_map(|n| std::fs::metadata(f.path(&format!("{n}.mp4"))).ok())
        .map(|m| m.len())
        .sum();
    assert!(kept <= 800, "{kept} bytes kept under a cap of 800");
    drop(b);
}

/// A file of ours that cannot be deleted: another file bind-mounted over it (unlink gives
/// EBUSY, as for a file in use on some filesystems), unmounted when dropped. Needs root, as
/// CI has.
struct Busy(PathBuf);

impl Busy {
    fn over(path: &Path, bytes: usize) -> Self {
        let under = path.with_extension("under");
        std::fs::write(&under, vec![9u8; bytes]).unwrap();
        let ok = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&under)
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot bind-mount over {} (needs root)", path.display());
        assert_eq!(
            std::fs::remove_file(path).unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        Self(path.to_owned())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_file_that_cannot_be_deleted_stays_listed_and_counted_and_other_files_make_the_room() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, None, Some(250)));
    f.write(&rec, "a.mp4", 100);
    let _busy = Busy::over(&f.path("a.mp4"), 100);
    f.write(&rec, "b.mp4", 100);
    f.write(&rec, "c.mp4", 100);
    // 300 bytes under a 250-byte cap: a.mp4, the oldest, cannot go, so b.mp4 goes instead (in
    // the pass right after, which a failed delete asks for at once).
    f.storage.pass();
    f.storage.pass();
    assert!(f.exists("a.mp4") && !f.exists("b.mp4") && f.exists("c.mp4"));
    let totals = f.storage.report().sinks["rec"];
    assert_eq!(
        (totals.kept_files, totals.kept_bytes),
        (2, 200),
        "{totals:?}"
    );
    assert_eq!(
        (totals.purged_files, totals.purged_bytes),
        (1, 100),
        "{totals:?}"
    );
    assert_eq!(totals.undeletable, 1, "{totals:?}");
    // Still listed in the index: a restarted storage still knows it as ours.
    let index = std::fs::read_to_string(f.path(index::INDEX)).unwrap();
    assert!(!index.contains("{\"del\":\"a.mp4\"}"), "{index}");
    assert!(index.contains("{\"del\":\"b.mp4\"}"), "{index}");
}

#[test]
fn a_full_disk_is_told_only_the_room_really_made() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f
        .storage
        .sink("rec", policy(Class::Continuous, Some(30), None));
    f.write(&rec, "a.mp4", 100);
    let _busy = Busy::over(&f.path("a.mp4"), 100);
    f.write(&rec, "b.mp4", 100);
    let writing = rec.create(&f.path("c.mp4"), "door").unwrap();
    // All but the open file are asked for; a.mp4 cannot go.
    assert_eq!(rec.disk_full(&f.path("c.mp4")), 100);
    assert!(f.exists("a.mp4") && !f.exists("b.mp4"));
    drop(writing);
}

#[test]
fn pages_are_newest_first_by_start_time_when_a_restart_indexes_old_files_after_new_ones() {
    let f = Fixture::new(StorageConfig::default());
    let rec = f.storage.sink("rec", policy(Class::Continuous, None, None));
    f.write(&rec, "b/old.mp4", 10);
    f.storage.stop();
    f.advance(10_000);
    // The restarted run writes camera a's folder first: b's old file is indexed after a's new.
    let again = Storage::start(StorageConfig::default(), f.clock.clone()).unwrap();
    let rec = again.sink("rec", policy(Class::Continuous, None, None));
    f.write(&rec, "a/new.mp4", 10);
    f.write(&rec, "b/newer.mp4", 10);
    let name = |s: &StoredFile| s.path.strip_prefix(f.dir.path()).unwrap().to_owned();
    let (page, next) = again.page(Class::Continuous, None, 10, |_, _, _| true);
    let names: Vec<_> = page.iter().map(name).collect();
    assert_eq!(
        names,
        ["b/newer.mp4", "a/new.mp4", "b/old.mp4"].map(PathBuf::from)
    );
    assert_eq!(next, None);
    // A page at a time, the same order.
    let (mut below, mut paged) = (None, Vec::new());
    loop {
        let (page, next) = again.page(Class::Continuous, below, 1, |_, _, _| true);
        paged.extend(page.iter().map(name));
        match next {
            Some(n) => below = Some(n),
            None => break,
        }
    }
    assert_eq!(paged, names);
    let found = again.find("rec", "old.mp4", |_| true).map(|s| name(&s));
    assert_eq!(found, Some(PathBuf::from("b/old.mp4")));
    again.stop();
}
