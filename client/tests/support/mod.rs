//! What the `cubec` test files share: running the real binary against a
//! daemon's socket and checking how it exited.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `cubec --socket SOCKET ARGS...`, with no stdin and no `CUBE_SOCKET`
/// from the environment.
pub fn cubec(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cubec"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("CUBE_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// [`cubec`] with `input` on its stdin, fed from another thread so that
/// a large input cannot deadlock against output the child is blocked on.
pub fn cubec_with_stdin(socket: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cubec"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("CUBE_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    output
}

/// Standard output, which must be UTF-8 (values are escaped in text).
pub fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
pub fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        stderr(output)
    );
}
