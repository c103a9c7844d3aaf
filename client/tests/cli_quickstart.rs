//! The README's Quickstart, run as written: its commands are read out of
//! README.md (so this test breaks when the README drifts from what cubec
//! does), run by `sh` one line at a time in a directory where
//! `./cube-data` is a throwaway daemon's data dir, as after `make run`.
//! A line exits 0 unless its comment says `exits N`; a line that runs
//! `until Ctrl-C` (watch) is read until it has replayed the first put and
//! then stopped; the lines below that
//! print something checkable are checked, and the closing `kill -9 ...;
//! make run` is followed by a restart and a read of what was acknowledged.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use cube_client::LocalDaemon;

/// The commands of the README's Quickstart `sh` block.
fn quickstart_lines() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = &readme[readme
        .find("## Quickstart")
        .expect("README has a Quickstart")..];
    let block = &section[section.find("```sh\n").expect("Quickstart has an sh block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// The exit code a line's comment promises (`exits N`), else 0.
fn promised_exit(line: &str) -> i32 {
    let Some(at) = line.find("  # ") else {
        return 0;
    };
    let comment = &line[at..];
    comment
        .find("exits ")
        .and_then(|i| comment[i + 6..].chars().next())
        .and_then(|c| c.to_digit(10))
        .map_or(0, |d| d as i32)
}

fn sh(dir: &Path, script: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_remove("CUBE_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// What the line's output must hold, for the lines worth checking: the
/// prefix of the command, and the text.
const CHECKS: &[(&str, &str)] = &[
    ("$cubec ping", "pong from cubed"),
    ("$cubec put default 1,2,3 hello", "(lsn "),
    ("$cubec get default 1,2,3", "hello"),
    (
        "$cubec --json get default -4,5,-6",
        "\"value_base64\":\"YmluAGFyeQ==\"",
    ),
    ("$cubec mget default", "9,9,9\t\\N"),
    ("$cubec walk default 0,0,0", "1,0,0"),
    ("$cubec path default 0,0,0 1,0,0", "1,0,0"),
    ("$cubec run default 5,5,5", "1"),
    ("$cubec step default", "ran 1 program"),
    ("$cubec ns create grid", "created namespace grid"),
    ("$cubec stats", "cmd.put.count"),
    ("$cubec import default default.jsonl", "imported"),
];

/// A line that runs until interrupted (`cubec watch`): started without a
/// shell (its words are plain), read until it has replayed the first put
/// of the Quickstart, then stopped as Ctrl-C would.
fn follow_until_replayed(dir: &Path, command: &str) {
    use std::io::{BufRead, BufReader};
    let words: Vec<&str> = command
        .split("  #")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(words[0], "$cubec", "{command}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cubec"))
        .args(&words[1..])
        .current_dir(dir)
        .env_remove("CUBE_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let replayed = line.ends_with("\t1,2,3\tput\thello");
        seen.push(line);
        if replayed {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        seen.iter().any(|l| l.contains("\tput\t")),
        "{command:?} printed {seen:?}"
    );
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cube-data");
    std::fs::create_dir(&data).unwrap();
    // cubed starts only on a data dir private to its user.
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut daemon = LocalDaemon::start_in(&data, &data.join("cubed.sock"), &[]).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"),
        dir.path().join("README.md"),
    )
    .unwrap();

    let lines = quickstart_lines();
    let first = &lines[0];
    assert!(first.starts_with("cubec="), "{first}");
    let define = format!("cubec='{}'\n", env!("CARGO_BIN_EXE_cubec"));
    let mut checked = Vec::new();
    let mut restarted = false;
    for line in &lines[1..] {
        let (command, then_make_run) = match line.split_once("; make run") {
            Some((kill, _)) => (kill, true),
            None => (line.as_str(), false),
        };
        if then_make_run {
            // The kill names exactly this data dir's daemon.
            let lock = std::fs::read_to_string(data.join("LOCK")).unwrap();
            assert_eq!(lock.trim(), daemon.pid().to_string(), "{line:?}");
        }
        if line.contains("until Ctrl-C") {
            follow_until_replayed(dir.path(), command);
            continue;
        }
        let out = sh(dir.path(), &format!("{define}{command}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(promised_exit(line)),
            "README line {line:?}\nstdout: {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for (prefix, needle) in CHECKS {
            if command.starts_with(prefix) {
                assert!(
                    text.contains(needle),
                    "{line:?} printed {text:?}, not {needle:?}"
                );
                checked.push(*prefix);
            }
        }
        if then_make_run {
            // kill exited 0: the SIGKILL reached that pid. Reap it (the
            // second SIGKILL finds it gone) and start again, as make run.
            daemon.kill9().unwrap();
            daemon.restart().unwrap();
            restarted = true;
        }
    }
    for (prefix, _) in CHECKS {
        assert!(
            checked.contains(prefix),
            "no Quickstart line starts {prefix:?}"
        );
    }
    assert!(
        restarted,
        "the Quickstart no longer ends with kill -9 ...; make run"
    );
    // ...and everything acknowledged is still there.
    let mut client = daemon.client().unwrap();
    let kept = client.get("default", cube_client::Coord::new(-4, 5, -6));
    assert_eq!(kept.unwrap().as_deref(), Some(&b"bin\0ary"[..]));
    assert!(dir.path().join("cube-backup").is_dir());
    assert!(
        std::fs::metadata(dir.path().join("default.jsonl"))
            .unwrap()
            .len()
            > 0
    );
}
