//! Every size, count and time flag of `cubed` has a range: the edges of
//! each (min - 1, min, max, max + 1) are parsed as cubed parses them, and
//! a real `cubed` given a value just outside exits 2, before touching any
//! data dir, with the range in its message (`--wal-segment-bytes
//! 18446744073709551615` used to zero-fill the disk; 0 made a WAL file
//! per write).
#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Output;

use clap::{CommandFactory, Parser};
use cube_server::Args;
use cube_server::config::FLAG_RANGES;

/// What a flag's edge needs beside it to pass the cross-flag check
/// (`Args::check`): a frame must carry the value limit plus 1 KiB.
fn companions(flag: &str) -> &'static [&'static str] {
    match flag {
        "--max-value-bytes" => &["--max-frame-bytes", "33554432"],
        "--max-frame-bytes" => &["--max-value-bytes", "1024"],
        // The client budget must hold one largest frame in and one out.
        "--max-client-memory" => &["--max-frame-bytes", "4096", "--max-value-bytes", "1024"],
        _ => &[],
    }
}

fn accepted(flag: &str, value: u64) -> Result<(), String> {
    let value = value.to_string();
    let mut argv = vec!["cubed", flag, value.as_str()];
    argv.extend(companions(flag));
    let args = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
    args.check()
}

#[test]
fn every_flag_accepts_its_range_and_refuses_just_outside() {
    for (flag, range) in FLAG_RANGES {
        let (min, max) = (*range.start(), *range.end());
        assert!(
            accepted(flag, min).is_ok(),
            "{flag} {min}: {:?}",
            accepted(flag, min)
        );
        assert!(
            accepted(flag, max).is_ok(),
            "{flag} {max}: {:?}",
            accepted(flag, max)
        );
        let expected = format!("{min}..={max}");
        for outside in [min.checked_sub(1), max.checked_add(1)]
            .into_iter()
            .flatten()
        {
            let refused = accepted(flag, outside).unwrap_err();
            assert!(refused.contains(&expected), "{flag} {outside}: {refused}");
        }
    }
}

/// Runs `cubed --data DATA ARGS`, which must exit at once.
fn run_cubed(data: &Path, args: &[&str]) -> Output {
    let mut argv = vec![OsStr::new("--data"), data.as_os_str()];
    argv.extend(args.iter().map(OsStr::new));
    common::cubed_that_must_exit(&argv)
}

#[test]
fn cubed_exits_2_naming_the_range_before_touching_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (flag, range) in FLAG_RANGES {
        let (min, max) = (*range.start(), *range.end());
        for outside in [min.checked_sub(1), max.checked_add(1)]
            .into_iter()
            .flatten()
        {
            let out = run_cubed(&data, &[flag, &outside.to_string()]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag} {outside}: {stderr}");
            assert!(
                stderr.contains(&format!("{min}..={max}")) && stderr.contains(flag),
                "{flag} {outside}: {stderr}"
            );
        }
    }
    // The case, and nothing was created.
    let out = run_cubed(&data, &["--wal-segment-bytes", "18446744073709551615"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !data.exists(),
        "cubed made its data dir before refusing a flag"
    );
}

#[test]
fn the_sync_interval_is_bounded_too() {
    let check = |policy: &str| {
        Args::try_parse_from(["cubed", "--sync", policy])
            .map_err(|e| e.to_string())
            .and_then(|a| a.check())
    };
    assert!(check("interval=1").is_ok());
    assert!(check("interval=60000").is_ok());
    assert!(check("interval=0").is_err());
    let refused = check("interval=60001").unwrap_err();
    assert!(refused.contains("1..=60000"), "{refused}");
}

/// A size, count or time flag added without a range fails here: give it
/// `value_parser = ranged::<T>(ITS_RANGE)` and a row in `FLAG_RANGES`.
#[test]
fn no_numeric_flag_is_left_without_a_range() {
    for arg in Args::command().get_arguments() {
        let numeric = arg.get_value_names().is_some_and(|names| {
            names
                .iter()
                .any(|n| ["N", "BYTES", "MS", "SECS"].contains(&n.as_str()))
        });
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        if numeric {
            assert!(
                FLAG_RANGES.iter().any(|(f, _)| *f == flag),
                "{flag} takes a number but has no row in FLAG_RANGES"
            );
        }
    }
}
