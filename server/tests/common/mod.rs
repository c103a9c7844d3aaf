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
