//! cubed runs on the allocator its build chose (docs/benchmarks.md,
//! "Allocator"): jemalloc by default, because merges give their memory
//! back to the system through it. Fails if the `#[global_allocator]` in
//! `src/main.rs` or the default feature is dropped.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use cube_client::LocalDaemon;

#[test]
#[cfg(feature = "jemalloc")]
fn cubed_allocates_through_jemalloc() {
    let cubed = LocalDaemon::find_binary().unwrap();
    // jemalloc prints its statistics at exit when asked to (tikv's build
    // prefixes its symbols and so its variable, `_RJEM_`): they appear
    // only if jemalloc served the process's allocations.
    let out = Command::new(&cubed)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.starts_with("cubed ") && stdout.contains("(allocator: jemalloc)"),
        "cubed --version should name jemalloc: {stdout}"
    );
    assert!(
        stderr.contains("Begin jemalloc statistics"),
        "jemalloc did not serve cubed's allocations (no statistics at exit): {stderr}"
    );
}

/// The default build is the measured one.
#[test]
fn the_default_build_chooses_jemalloc() {
    let manifest = include_str!("../Cargo.toml");
    assert!(
        manifest
            .lines()
            .any(|l| l.trim() == r#"default = ["jemalloc"]"#),
        "server/Cargo.toml's default features should be [\"jemalloc\"] (docs/benchmarks.md, \"Allocator\")"
    );
}

/// Built without the feature, the jemalloc test above does not exist: fail
/// instead of passing silently.
#[test]
#[cfg(not(feature = "jemalloc"))]
fn cubed_allocates_through_jemalloc() {
    panic!(
        "cube-server was built without its `jemalloc` feature: cubed does not run on the measured allocator"
    );
}
