//! cubed runs on the allocator its build chose (docs/benchmarks.md,
//! "Allocator"): jemalloc by default (cube-server's default feature),
//! glibc's malloc with `--no-default-features`, mimalloc with its feature.
//! Fails if `cubed --version` names another allocator than the one linked,
//! or if jemalloc, when chosen, does not serve the process or runs without
//! the options it was measured with.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use cube_client::LocalDaemon;

/// `cubed --version` with `env` set; asserts it succeeded.
fn version(env: (&str, &str)) -> (String, String) {
    let cubed = LocalDaemon::find_binary().unwrap();
    let out = Command::new(&cubed)
        .arg("--version")
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[cfg(feature = "jemalloc")]
fn cubed_allocates_through_jemalloc() {
    // jemalloc prints its statistics at exit when asked to (tikv's build
    // prefixes its symbols and so its variable, `_RJEM_`): they appear
    // only if jemalloc served the process's allocations.
    let (stdout, stderr) = version(("_RJEM_MALLOC_CONF", "stats_print:true"));
    assert!(
        stdout.starts_with("cubed ") && stdout.contains("(allocator: jemalloc)"),
        "cubed --version should name jemalloc: {stdout}"
    );
    assert!(
        stderr.contains("Begin jemalloc statistics"),
        "jemalloc did not serve cubed's allocations (no statistics at exit): {stderr}"
    );
    // The options .cargo/config.toml compiles in: without them freed pages
    // stay in RSS for 10 s, until the arena is next used
    // (tests/malformed_frames.rs, `a_big_frame_leaves_no_big_buffer_behind`).
    for option in [
        "opt.background_thread: true",
        "opt.dirty_decay_ms: 1000",
        "opt.muzzy_decay_ms: 0",
    ] {
        assert!(
            stderr.contains(option),
            "cubed's jemalloc was built without `{option}` (was it built outside the \
             workspace, without .cargo/config.toml?): {stderr}"
        );
    }
}

#[test]
#[cfg(not(any(feature = "jemalloc", feature = "mimalloc")))]
fn a_build_without_features_allocates_through_glibc_malloc() {
    // Had a jemalloc been linked, it would print its statistics here.
    let (stdout, stderr) = version(("_RJEM_MALLOC_CONF", "stats_print:true"));
    assert!(
        stdout.starts_with("cubed ") && stdout.contains("(allocator: system malloc)"),
        "cubed --version should name the system malloc: {stdout}"
    );
    assert!(
        !stderr.contains("jemalloc statistics"),
        "a jemalloc served a build without allocator features: {stderr}"
    );
}
