//! Helpers the server's integration tests share.
#![allow(clippy::unwrap_used, dead_code)]

use cube_client::{Client, StatsValue};

/// The counter `name` from the daemon's `stats`.
pub fn stat(c: &mut Client, name: &str) -> u64 {
    match c
        .stats()
        .unwrap()
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.value)
    {
        Some(StatsValue::Count(v)) => v,
        other => panic!("stat {name}: {other:?}"),
    }
}

/// A process's resident memory, in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Prints what the daemon was doing when a test fails: its log, and for
/// each of its threads the name, scheduler state and kernel wait channel,
/// so a hang (a client timing out) shows which thread was stuck where.
/// Hold one for the length of the test; it reports only while panicking.
pub struct DumpOnFailure<'d>(pub &'d cube_client::LocalDaemon);

impl Drop for DumpOnFailure<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let pid = self.0.pid();
        eprintln!("---- cubed (pid {pid}) log ----\n{}", self.0.log_text());
        eprintln!("---- cubed threads: how many, name, state, wait channel ----");
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            eprintln!("(the process is gone)");
            return;
        };
        // A thousand connection threads in one state are one line.
        let mut kinds = std::collections::BTreeMap::<(String, String, String), u32>::new();
        for task in tasks.flatten() {
            let read = |file: &str| {
                std::fs::read_to_string(task.path().join(file))
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            };
            // The state is the field after the parenthesised name.
            let stat = read("stat");
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_owned();
            let name = read("comm")
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .to_owned();
            *kinds.entry((name, state, read("wchan"))).or_default() += 1;
        }
        for ((name, state, wchan), n) in kinds {
            eprintln!("{n:>6} {name:<16} {state} {wchan}");
        }
    }
}

/// Creates namespace `name` holding at most `max_cells` cells.
pub fn create_with_max_cells(c: &mut Client, name: &str, max_cells: u64) {
    use cube_client::{NamespaceName, NamespaceSpec, Request, Response};
    let request = Request::NsCreate {
        ns: NamespaceName::new(name).unwrap(),
        spec: NamespaceSpec {
            max_cells: Some(max_cells),
            ..Default::default()
        },
    };
    assert!(matches!(c.call(&request).unwrap(), Response::NsCreated(_)));
}

/// Polls `done` every few milliseconds until it holds. The deadline only
/// catches a hang: a test waits on the event, never on the clock.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "still waiting, after 60 s, for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// One thread of a process, by its name (`comm`): its scheduler state
/// (`R` running, `S` sleeping, ...) and the CPU it has used, in clock ticks.
pub fn thread_state(pid: u32, name: &str) -> Option<(char, u64)> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // Fields after the parenthesised name: state is the 1st, utime the
        // 12th and stime the 13th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        return Some((state, ticks));
    }
    None
}

/// Runs `cubed ARGS`, which must exit by itself (a refusal at start); a
/// `cubed` still running after a minute started instead, so it is killed
/// and the test fails.
pub fn cubed_that_must_exit(args: &[&std::ffi::OsStr]) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(cube_client::LocalDaemon::find_binary().unwrap())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cubed {args:?} started instead of refusing");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Whether tests that act as other uids must skip: only root can run
/// processes as another uid. Says so on stderr when it skips.
pub fn cannot_switch_uids(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return false;
    }
    eprintln!("{test}: not running as root, cannot act as another uid; skipping");
    true
}

/// Whether every directory above `path` lets other users through.
pub fn reachable_by_others(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().all(|dir| {
        std::fs::metadata(dir).is_ok_and(|m| !m.is_dir() || m.permissions().mode() & 0o001 != 0)
    })
}

/// `program` itself if other uids can run it, else a 0755 copy named
/// `name` in `dir` (a build under a private directory).
pub fn runnable_by_others(
    program: std::path::PathBuf,
    dir: &std::path::Path,
    name: &str,
) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    if reachable_by_others(&program) {
        return program;
    }
    let copy = dir.join(name);
    std::fs::copy(&program, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}
