//! The shipped unit, `systemd/vidflow@.service`, as `tests/systemd.rs` reproduces it without
//! systemd as PID 1: its `KEY=VALUE` settings, the system calls its `SystemCallFilter=` lines
//! allow (as `systemd-analyze syscall-filter` expands the groups) as a seccomp program of the
//! test's own answering EPERM to the rest (as `SystemCallErrorNumber=EPERM`), the folders it
//! names moved into a sandbox of the test's own, and a reader of what `strace -f -y` saw a run
//! do: the calls it made and the paths it wrote.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The unit's `KEY=VALUE` lines, comments left out, in order.
pub fn settings(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect()
}

/// Every value of `key`, in order.
pub fn values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    settings(text)
        .into_iter()
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .collect()
}

pub fn analyze(args: &[&str]) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .output()
        .expect("systemd-analyze (package systemd, installed by scripts/install-deps)")
}

/// The system calls the unit's `SystemCallFilter=` lines let through, by name. systemd's rule:
/// a first line without `~` is an allow list (`@default` always in it); each later `~` line
/// takes its calls out, each later plain line puts its calls back. Every other call fails with
/// `SystemCallErrorNumber=`.
pub fn allowed_calls(unit_text: &str) -> BTreeSet<String> {
    let lines = values(unit_text, "SystemCallFilter");
    let (first, rest) = lines.split_first().expect("a SystemCallFilter= line");
    assert!(
        !first.starts_with('~'),
        "the first SystemCallFilter= line is an allow list: {first}"
    );
    let mut allowed = expand("@default");
    allowed.extend(expand(first));
    for value in rest {
        match value.strip_prefix('~') {
            Some(names) => expand(names).iter().for_each(|n| {
                allowed.remove(n);
            }),
            None => allowed.extend(expand(value)),
        }
    }
    allowed
}

/// System call names and `@groups` (as `systemd-analyze syscall-filter` lists them, nested
/// groups too), as names.
pub fn expand(names: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for name in names.split_whitespace() {
        if name.starts_with('@') {
            let listed = analyze(&["syscall-filter", name]);
            assert!(listed.status.success(), "{name}");
            let text = String::from_utf8(listed.stdout).unwrap();
            for line in text.lines().skip(1).map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    out.extend(expand(line));
                }
            }
        } else {
            out.insert(name.to_owned());
        }
    }
    out
}

/// x86-64's system call numbers, by name, from the kernel's header (linux-libc-dev).
#[cfg(target_arch = "x86_64")]
pub fn syscall_numbers() -> BTreeMap<String, u32> {
    let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    std::fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("{header}: {e} (package linux-libc-dev)"))
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("#define __NR_")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.parse().ok()?))
        })
        .collect()
}

/// A seccomp program that lets each call of `allowed` through and answers EPERM to every
/// other native call, as the unit's filter does (names this kernel does not have are left out,
/// as systemd leaves them).
#[cfg(target_arch = "x86_64")]
pub fn allow_filter(allowed: &BTreeSet<String>) -> Vec<libc::sock_filter> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let table = syscall_numbers();
    let op = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: u16::try_from(code).unwrap(),
        jt,
        jf,
        k,
    };
    let eperm = libc::SECCOMP_RET_ERRNO | u32::try_from(libc::EPERM).unwrap();
    let mut program = vec![
        // seccomp_data.arch: another ABI's calls are refused (SystemCallArchitectures=native).
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            1,
            0,
        ),
        op(libc::BPF_RET | libc::BPF_K, eperm, 0, 0),
        // seccomp_data.nr
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
    ];
    for n in allowed.iter().filter_map(|name| table.get(name)) {
        program.push(op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, *n, 0, 1));
        program.push(op(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ALLOW,
            0,
            0,
        ));
    }
    program.push(op(libc::BPF_RET | libc::BPF_K, eperm, 0, 0));
    program
}

/// Installs `program` on the calling thread (no new privileges first, as an unprivileged
/// service gets). For `pre_exec`: only prctl runs, which is async-signal-safe.
///
/// # Safety
/// Between fork and exec only; `program` outlives the call (the kernel copies it).
pub unsafe fn install_filter(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).unwrap_or(u16::MAX),
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with these arguments reads only `fprog`, which lives until it returns.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &raw const fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The user a `DynamicUser=` service runs as, when this test runs as root: none of root's
/// exemptions from permissions (and none of SQLite's chown calls, made only as root).
pub const SERVICE_UID: libc::uid_t = 65534;

/// The machine's paths the unit names, each beside a folder of the test standing in for it.
pub struct Sandbox {
    _root: tempfile::TempDir,
    pub root: PathBuf,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        // Traversable by the service's user, as / is.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        Self { _root: dir, root }
    }

    /// A path or word of the unit with its folders moved into the sandbox, systemd's
    /// specifiers expanded (`%i` is instance `demo`) and the installed files taken from this
    /// build and checkout.
    pub fn map(&self, word: &str) -> String {
        let word = word
            .replace("%i", "demo")
            .replace("%S", "/var/lib")
            .replace("%C", "/var/cache");
        let installed = [
            (
                "/usr/local/bin/vidflow",
                env!("CARGO_BIN_EXE_vidflow").to_owned(),
            ),
            (
                "/usr/local/share/vidflow/models",
                crate::common::repo_root()
                    .join("models")
                    .display()
                    .to_string(),
            ),
            (
                "/usr/local/lib/vidflow/runtimes",
                crate::common::repo_root()
                    .join("runtimes")
                    .display()
                    .to_string(),
            ),
        ];
        for (path, here) in installed {
            if let Some(rest) = word.strip_prefix(path) {
                return format!("{here}{rest}");
            }
        }
        let moved = ["/var/lib", "/var/cache", "/etc/vidflow"];
        if moved.iter().any(|p| Path::new(&word).starts_with(p)) {
            return format!("{}{word}", self.root.display());
        }
        word
    }

    /// A folder of the unit, made in the sandbox, the service's if `owned`.
    pub fn folder(&self, path: &str, owned: bool) -> PathBuf {
        let here = PathBuf::from(self.map(path));
        assert!(
            here.starts_with(&self.root),
            "{path} is not moved into the sandbox"
        );
        std::fs::create_dir_all(&here).unwrap();
        // SAFETY: geteuid has no preconditions.
        if owned && unsafe { libc::geteuid() } == 0 {
            let c = std::ffi::CString::new(here.to_str().unwrap()).unwrap();
            // SAFETY: chown reads the NUL-terminated path we own, alive until it returns.
            let changed = unsafe { libc::chown(c.as_ptr(), SERVICE_UID, SERVICE_UID) };
            assert_eq!(changed, 0, "{}", std::io::Error::last_os_error());
        }
        here
    }
}

/// The folders a run of the unit may write in: its state and cache directories, its
/// `ReadWritePaths=`, its private /tmp and /var/tmp, and the API file systems
/// `ProtectSystem=strict` leaves writable (devices, its own /proc entries).
pub fn writable(text: &str, sandbox: &Sandbox) -> Vec<PathBuf> {
    let value = |k: &str| values(text, k);
    assert_eq!(value("ProtectSystem"), ["strict"], "{text}");
    assert_eq!(value("PrivateTmp"), ["yes"], "{text}");
    let mut roots: Vec<PathBuf> = [
        "/tmp",
        "/var/tmp",
        "/dev",
        "/proc/self",
        "/proc/thread-self",
    ]
    .map(PathBuf::from)
    .into();
    let dirs = [
        ("StateDirectory", "/var/lib/"),
        ("CacheDirectory", "/var/cache/"),
    ];
    for (key, base) in dirs {
        for name in value(key).iter().flat_map(|v| v.split_whitespace()) {
            roots.push(sandbox.folder(&format!("{base}{name}"), true));
        }
    }
    for path in value("ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace())
    {
        roots.push(PathBuf::from(sandbox.map(path.trim_start_matches('-'))));
    }
    roots
}

/// What `strace -f -y -s 4096 -o FILE` saw: each system call made (by any process of the run)
/// with how many times, those of them that failed with EPERM, and every path a call wrote or
/// tried to write (made, opened for writing, removed, renamed, linked, changed), made absolute:
/// against the directory `-y` prints for a `*at` call, else against the process's working
/// directory (`cwd` at the start, followed through its `chdir` calls).
#[derive(Debug, Default)]
pub struct Trace {
    pub calls: BTreeMap<String, usize>,
    pub refused: BTreeSet<String>,
    pub writes: Vec<(String, PathBuf)>,
}

pub fn read_trace(path: &Path, cwd: &Path) -> Trace {
    let text = std::fs::read_to_string(path).unwrap();
    let mut trace = Trace::default();
    let mut cwds: BTreeMap<&str, PathBuf> = BTreeMap::new();
    for line in text.lines() {
        // "PID name(args) = result", or "PID name(args <unfinished ...>" (its end comes in a
        // "<... name resumed>" line, whose arguments were already given).
        let Some((pid, call)) = line.split_once(' ') else {
            continue;
        };
        let call = call.trim_start();
        let Some((name, rest)) = call.split_once('(') else {
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        *trace.calls.entry(name.to_owned()).or_default() += 1;
        if rest.contains("= -1 EPERM") {
            trace.refused.insert(name.to_owned());
        }
        let args = split_args(rest);
        let here = format!("AT_FDCWD<{}>", cwds.get(pid).map_or(cwd, |p| p).display());
        if name == "chdir" && !rest.contains("= -1 ") {
            let moved = args.first().and_then(|a| resolve(Some(&here), a));
            cwds.insert(pid, moved.unwrap_or_else(|| PathBuf::from("?")));
        }
        trace.writes.extend(
            written(name, &args, &here)
                .into_iter()
                .map(|p| (name.to_owned(), p)),
        );
    }
    for line in text.lines().filter(|l| l.contains(" resumed>")) {
        if let Some(name) = line.split("<... ").nth(1).and_then(|s| s.split(' ').next())
            && line.contains("= -1 EPERM")
        {
            trace.refused.insert(name.to_owned());
        }
    }
    trace
}

/// The top-level arguments of a call as strace prints them (strings quoted, structures in
/// braces, `-y` paths in angle brackets), up to the closing parenthesis.
fn split_args(rest: &str) -> Vec<String> {
    let (mut args, mut current) = (Vec::new(), String::new());
    let (mut depth, mut quoted, mut escaped) = (0usize, false, false);
    for c in rest.chars() {
        if quoted {
            current.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '{' | '[' | '(' | '<' => depth += 1,
            '}' | ']' | '>' if depth > 0 => depth -= 1,
            ')' if depth == 0 => break,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(current.trim().to_owned());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_owned());
    }
    args
}

/// The paths a call writes: (directory argument, path argument) pairs by call; `here` is the
/// working directory, as `-y` prints `AT_FDCWD`.
fn written(name: &str, args: &[String], here: &str) -> Vec<PathBuf> {
    let arg = |i: usize| args.get(i).map_or("", String::as_str);
    let writes_open = |flags: &str| {
        ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC"]
            .iter()
            .any(|f| flags.contains(f))
    };
    let pairs: Vec<(Option<&str>, &str)> = match name {
        "open" if writes_open(arg(1)) => vec![(None, arg(0))],
        "openat" if writes_open(arg(2)) => vec![(Some(arg(0)), arg(1))],
        "openat2" if writes_open(arg(2)) => vec![(Some(arg(0)), arg(1))],
        "creat" | "mkdir" | "rmdir" | "unlink" | "truncate" | "chmod" | "chown" | "lchown"
        | "mknod" => vec![(None, arg(0))],
        "mkdirat" | "unlinkat" | "fchmodat" | "fchownat" | "mknodat" => {
            vec![(Some(arg(0)), arg(1))]
        }
        "rename" => vec![(None, arg(0)), (None, arg(1))],
        "renameat" | "renameat2" => vec![(Some(arg(0)), arg(1)), (Some(arg(2)), arg(3))],
        "link" | "symlink" => vec![(None, arg(1))],
        "linkat" => vec![(Some(arg(2)), arg(3))],
        "symlinkat" => vec![(Some(arg(1)), arg(2))],
        _ => vec![],
    };
    pairs
        .into_iter()
        .filter_map(|(dir, path)| resolve(Some(dir.unwrap_or(here)), path))
        .collect()
}

/// `path` (a quoted strace string) made absolute against `dir` (`AT_FDCWD</cwd>` or
/// `FD</path>`, as `-y` prints them; `?` where it printed none); `None` for a path strace did
/// not print as a string.
fn resolve(dir: Option<&str>, path: &str) -> Option<PathBuf> {
    let path = path.strip_prefix('"')?.strip_suffix('"')?;
    let path = path.replace("\\\"", "\"").replace("\\\\", "\\");
    let path = Path::new(&path);
    let base = match dir {
        _ if path.is_absolute() => PathBuf::from("/"),
        Some(dir) => {
            let inside = dir.split_once('<').map_or("?", |(_, p)| p);
            PathBuf::from(inside.strip_suffix('>').unwrap_or(inside))
        }
        None => PathBuf::from("?"),
    };
    let mut out = PathBuf::new();
    for part in base.join(path).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[test]
fn strace_lines_give_calls_refusals_and_absolute_written_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.txt");
    std::fs::write(
        &path,
        "12 openat(AT_FDCWD</var/lib/vidflow>, \"out/a, b.jsonl\", O_WRONLY|O_CREAT|O_CLOEXEC, \
         0666) = 6</var/lib/vidflow/out/a, b.jsonl>\n\
         12 openat(AT_FDCWD</var/lib/vidflow>, \"/etc/ld.so.cache\", O_RDONLY|O_CLOEXEC) = 3\n\
         13 mkdir(\"/.cache/gstreamer-1.0\", 0700 <unfinished ...>\n\
         15 chdir(\"/usr/lib/x\") = 0\n\
         15 mkdir(\"out\", 0777) = 0\n\
         16 mkdir(\"out\", 0777) = 0\n\
         13 <... mkdir resumed>) = -1 EROFS (Read-only file system)\n\
         13 renameat2(7</tmp/x>, \"../y\", AT_FDCWD</var/lib/vidflow>, \"z\", 0) = 0\n\
         14 sched_setaffinity(0, 8, [0] <unfinished ...>\n\
         14 <... sched_setaffinity resumed>) = -1 EPERM (Operation not permitted)\n\
         14 set_mempolicy(MPOL_DEFAULT, NULL, 0) = -1 EPERM (Operation not permitted)\n\
         14 --- SIGCHLD {si_signo=SIGCHLD} ---\n\
         14 +++ exited with 0 +++\n",
    )
    .unwrap();
    let trace = read_trace(&path, Path::new("/var/lib/vidflow"));
    let names: Vec<&str> = trace.calls.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "chdir",
            "mkdir",
            "openat",
            "renameat2",
            "sched_setaffinity",
            "set_mempolicy"
        ]
    );
    assert_eq!(trace.calls["openat"], 2);
    let refused: Vec<&str> = trace.refused.iter().map(String::as_str).collect();
    assert_eq!(refused, ["sched_setaffinity", "set_mempolicy"]);
    let writes: Vec<(&str, &str)> = trace
        .writes
        .iter()
        .map(|(c, p)| (c.as_str(), p.to_str().unwrap()))
        .collect();
    assert_eq!(
        writes,
        [
            ("openat", "/var/lib/vidflow/out/a, b.jsonl"),
            ("mkdir", "/.cache/gstreamer-1.0"),
            ("mkdir", "/usr/lib/x/out"),
            ("mkdir", "/var/lib/vidflow/out"),
            ("renameat2", "/tmp/y"),
            ("renameat2", "/var/lib/vidflow/z"),
        ]
    );
}
