//! Guards what a panic on the writer thread does: the process stops (it
//! must not live on with in-flight writes that nobody will ever answer),
//! saying why on stderr.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use cube_store::{Engine, EngineConfig};

const CHILD_ENV: &str = "CUBE_WRITER_PANIC_CHILD";

#[test]
fn a_panicking_writer_stops_the_process() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        // The child: a transaction closure runs on the writer thread.
        let engine = Engine::open(EngineConfig::new(dir)).unwrap();
        let session = engine.session().unwrap();
        // The unwinding writer drops this transaction's reply channel, so
        // the call returns at once; the abort follows a moment later.
        let _ = session.transact(|_| -> () { panic!("an invariant broke on the writer") });
        std::thread::sleep(std::time::Duration::from_secs(30));
        std::process::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panicking_writer_stops_the_process",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "{:?}\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains("an invariant broke on the writer"),
        "{stderr}"
    );
    assert!(stderr.contains("cube-writer panicked"), "{stderr}");
}
