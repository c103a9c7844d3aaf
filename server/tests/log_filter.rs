//! `RUST_LOG` on a real `cubed` (`docs/operations.md`, `--log-level`):
//! directives pick levels per module on top of `--log-level`, and a
//! directive that is not one says what to write instead of being ignored.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cube_client::{Client, LocalDaemon};

/// Only catches a hang; every wait below ends on an event.
const HANG: Duration = Duration::from_secs(60);

#[test]
fn a_bad_rust_log_directive_stops_cubed_with_what_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "cube_server=loud")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A cubed that ignored the directive would serve forever: stop it
    // and fail rather than hang.
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > HANG {
            child.kill().unwrap();
            panic!("cubed started despite the bad RUST_LOG");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad RUST_LOG directive \"cube_server=loud\""),
        "{err}"
    );
    assert!(err.contains("TARGET=LEVEL"), "{err}");
    assert!(!dir.path().join("data").exists(), "nothing was started");
}

#[test]
fn rust_log_turns_on_debug_for_one_module_under_log_level_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cubed.sock");
    let mut child = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("--socket")
        .arg(&socket)
        .args(["--log-level", "error"])
        .env("RUST_LOG", "cube_server::server=debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    // Ready when the socket answers; then a connection that ends is a
    // debug event of cube_server::server.
    let started = Instant::now();
    let client = loop {
        match Client::connect(&socket) {
            Ok(client) => break client,
            // Polls the socket; the interval only spares the CPU.
            Err(_) if started.elapsed() < HANG => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("cubed never answered: {e}"),
        }
    };
    drop(client);
    let mut seen = Vec::new();
    let found = loop {
        match lines.recv_timeout(HANG) {
            Ok(line) if line.contains(" DEBUG cubed: connection ") => break line,
            Ok(line) => seen.push(line),
            Err(e) => panic!("no debug line ({e}); the log was:\n{}", seen.join("\n")),
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(found.contains("closed"), "{found}");
}
