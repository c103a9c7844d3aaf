//! Drive a storage daemon hard and report how it held up.
//!
//! One job: the stress driver behind `cube-stress`, `make stress` and
//! `make compare`. Client threads with persistent connections run a
//! workload against a target (a throwaway `cubed` by default, or Redis or
//! SQLite for comparison), record per-command latency histograms, track
//! every acknowledged write and read it back at the end (and after every
//! `--crash-every` SIGKILL), then print a table and optionally write JSON
//! and an SVG latency-by-percentile plot. `docs/benchmarks.md` documents
//! the output and keeps the latest comparison. `cube-stress crash`
//! ([`crash`], `make crash`) is the crash torture of `docs/robustness.md`;
//! `--hostile N` ([`hostile`]) measures the clients beside hostile ones;
//! `cube-stress scale` ([`scale`], `make scale`) measures a data set too
//! big for RAM.
#![cfg_attr(test, allow(clippy::unwrap_used))]
// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod cli;
pub mod compare;
pub mod crash;
mod error;
pub mod hostile;
pub mod json;
pub mod keyspace;
pub mod latency;
pub mod ledger;
pub mod plot;
pub mod program_workload;
pub mod report;
pub mod rng;
pub mod run;
pub mod scale;
pub mod scan_workload;
pub mod target;
pub mod verify;
pub mod walk_workload;
pub mod watch_follow;
pub mod watch_workload;
pub mod workload;

pub use error::StressError;
