//! `cubed`, the cube daemon: one job, serve the store over a Unix socket.
//!
//! Threads (see `docs/ARCHITECTURE.md`):
//! - the **reactor** ([`server`]): a mio `Poll` accepting on the listener,
//!   woken by a `Waker` on SIGINT/SIGTERM;
//! - one **connection thread** per client ([`connection`]): reads a frame,
//!   serves reads straight from the in-memory store, hands writes to the
//!   writer, answers in request order;
//! - the **writer** (in `cube-store`): group commit to the WAL.
//!
//! A panic on any of them aborts the process ([`panic_policy`]).
#![cfg_attr(test, allow(clippy::unwrap_used))]
// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod access;
mod batch;
mod client_memory;
pub mod command_stats;
pub mod config;
mod connection;
mod duration_flag;
mod edges;
mod listing;
pub mod log;
mod metrics_http;
mod mget;
mod namespaces;
pub mod panic_policy;
mod programs;
pub mod server;
mod signals;
pub mod verify;
mod watch;
mod watch_hub;
mod watch_outlet;
mod watch_stats;
mod write_reply;

pub use config::Args;
pub use server::run;

/// Compiles a cell program without running it, as `prog` does before
/// storing one; `Err` carries Lua's reason. Public only for the
/// `program_source` fuzz target (`fuzz/`).
#[doc(hidden)]
pub fn check_program_syntax(source: &[u8]) -> Result<(), String> {
    programs::sandbox::check_syntax(source).map_err(|e| e.message)
}

/// Stores and runs cell programs through the same code as `prog` and
/// `run`, on an engine of its own. Public only for the `program_run` fuzz
/// target (`fuzz/`) and `tests/program_garbage.rs`; behind the cargo
/// feature `program-harness`.
#[cfg(feature = "program-harness")]
#[doc(hidden)]
pub use programs::harness::{
    HARNESS_MAX_RUN_WALL, HarnessLimits, HarnessOutcome, HarnessRun, ProgramHarness,
};
