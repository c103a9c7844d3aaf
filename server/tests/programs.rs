//! Guards cell programs against a real cubed: syntax errors refused with their line, failed runs applying nothing but still recorded, fuel and memory budgets stopping runaway programs without harming other clients, exact telemetry under concurrency and across kill -9, restart and checkpoint, and every sandbox escape refused.
#![allow(clippy::unwrap_used)]

mod common;

use common::rss_kib;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Client, ClientError, Coord, ErrorCode, LocalDaemon, ProgramValue, RunOutcome};

const NS: &str = "default";

/// Only catches a hang: a runaway program that nothing stopped, or a
/// bystander stuck behind one. These tests check which budget stopped a
/// program (its error code and message), not how fast: that is measured by
/// `writer-bounds/run` in `server/benches/writer_bounds.rs`
/// (docs/benchmarks.md, "Writer time per request").
const HANG: Duration = Duration::from_secs(60);

fn code(err: &ClientError) -> Option<ErrorCode> {
    err.server_code()
}

fn run_err(c: &mut Client, at: Coord) -> ClientError {
    c.run(NS, at, &[]).unwrap_err()
}

#[test]
fn a_syntax_error_is_refused_with_its_line_and_nothing_is_stored() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(1, 2, 3);
    let err = c
        .prog(NS, at, b"local a = 1\nlocal b = 2\nlocal = 3\n")
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::ProgramSyntax), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("line 3:") && text.contains("nothing was stored"),
        "{text}"
    );
    // Nothing stored: running says there is no program.
    let err = run_err(&mut c, at);
    assert_eq!(code(&err), Some(ErrorCode::InvalidArgument), "{err}");
    assert_eq!(c.cell_stats(NS, at, 10).unwrap().program_bytes, None);
    // A good program then a bad one: the good one stays.
    c.prog(NS, at, b"return 7").unwrap();
    c.prog(NS, at, b"return (").unwrap_err();
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Int(7));
}

#[test]
fn a_failed_run_applies_nothing_and_is_still_recorded() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(0, 0, 0);
    c.put(NS, Coord::new(1, 0, 0), b"before").unwrap();
    let source = b"cube.put(1, 0, 0, 'after')\ncube.put(2, 0, 0, 'new')\ncube.rincr(0, 0, 0)\n\
                   error('boom')";
    c.prog(NS, at, source).unwrap();
    let err = run_err(&mut c, at);
    assert_eq!(code(&err), Some(ErrorCode::ProgramError), "{err}");
    assert!(err.to_string().contains("line 4: boom"), "{err}");
    assert_eq!(c.get(NS, Coord::new(1, 0, 0)).unwrap().unwrap(), b"before");
    assert_eq!(c.get(NS, Coord::new(2, 0, 0)).unwrap(), None);
    assert_eq!(c.get(NS, at).unwrap(), None);
    let stats = c.cell_stats(NS, at, 10).unwrap();
    assert_eq!((stats.runs, stats.failures), (1, 1));
    let record = &stats.records[0];
    assert_eq!(record.outcome, RunOutcome::Error);
    assert_eq!(record.cells_written, 0);
    assert!(record.message.contains("boom"), "{record:?}");
    // An API error names the function and the line; non-numeric data
    // fails the numeric helpers clearly.
    c.put(NS, Coord::new(5, 0, 0), b"abc").unwrap();
    c.prog(
        NS,
        at,
        b"local a = 1\nlocal n = cube.num(5, 0, 0)\nreturn n",
    )
    .unwrap();
    let err = run_err(&mut c, at);
    let text = err.to_string();
    assert!(
        text.contains("line 2: cube.num: the cell 5,0,0 holds \"abc\", not a decimal number"),
        "{text}"
    );
    // A result that cannot be returned fails the run too.
    c.prog(NS, at, b"cube.put(6, 0, 0, 'x') return function() end")
        .unwrap();
    let err = run_err(&mut c, at);
    assert!(err.to_string().contains("the run's result"), "{err}");
    assert_eq!(c.get(NS, Coord::new(6, 0, 0)).unwrap(), None);
    assert_eq!(c.cell_stats(NS, at, 0).unwrap().failures, 3);
}

/// A run whose writes take its namespace past a quota fails like any other
/// failed run: `quota_exceeded`, nothing applied, and recorded in the
/// cell's telemetry (a past bug: the writer refused the run's writes
/// and its telemetry record with them, while the daemon counted the run).
#[test]
fn a_run_over_its_namespace_quota_applies_nothing_and_is_recorded() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    common::create_with_max_cells(&mut c, "small", 1);
    let at = Coord::new(0, 0, 0);
    c.prog(
        "small",
        at,
        b"cube.put(1, 0, 0, 'a') cube.put(2, 0, 0, 'b') return 1",
    )
    .unwrap();
    let err = c.run("small", at, &[]).unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::QuotaExceeded), "{err}");
    assert_eq!(c.get("small", Coord::new(1, 0, 0)).unwrap(), None);
    assert_eq!(c.get("small", Coord::new(2, 0, 0)).unwrap(), None);
    let stats = c.cell_stats("small", at, 10).unwrap();
    assert_eq!((stats.runs, stats.failures), (1, 1), "{stats:?}");
    assert_eq!(stats.records[0].outcome, RunOutcome::Error);
    assert_eq!(stats.records[0].cells_written, 0);
    // One cell fits: the same namespace takes a run that writes one.
    c.prog("small", at, b"cube.put(1, 0, 0, 'a') return 1")
        .unwrap();
    c.run("small", at, &[]).unwrap();
    assert_eq!(c.cell_stats("small", at, 0).unwrap().runs, 2);
}

#[test]
fn results_and_arguments_cross_the_wire() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(-1, -2, -3);
    c.prog(
        NS,
        at,
        b"local a, b = ...\nreturn { a, b, n = select('#', ...), x = cube.x, f = 0.5, t = true }",
    )
    .unwrap();
    let reply = c.run(NS, at, &[b"one", b"\xff\x00"]).unwrap();
    assert_eq!(reply.seq, 1);
    assert_eq!(reply.cells_written, 0);
    assert_eq!(
        reply.value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), ProgramValue::Bytes(b"one".to_vec())),
            (
                ProgramValue::Int(2),
                ProgramValue::Bytes(b"\xff\x00".to_vec())
            ),
            (ProgramValue::Bytes(b"f".to_vec()), ProgramValue::Float(0.5)),
            (ProgramValue::Bytes(b"n".to_vec()), ProgramValue::Int(2)),
            (ProgramValue::Bytes(b"t".to_vec()), ProgramValue::Bool(true)),
            (ProgramValue::Bytes(b"x".to_vec()), ProgramValue::Int(-1)),
        ])
    );
    c.prog(NS, at, b"return nil").unwrap();
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Nil);
    c.prog(NS, at, b"return { {} }").unwrap();
    assert_eq!(code(&run_err(&mut c, at)), Some(ErrorCode::ProgramError));
    // Removing the program.
    assert!(c.prog(NS, at, b"").unwrap().replaced);
    assert_eq!(code(&run_err(&mut c, at)), Some(ErrorCode::InvalidArgument));
}

#[test]
fn fuel_and_memory_budgets_stop_runaway_programs_without_harming_other_clients() {
    let daemon = LocalDaemon::start_fresh(&["--program-time-ms", "10000"]).unwrap();
    let mut c = daemon.client().unwrap();
    let spin = Coord::new(0, 0, 0);
    let bomb = Coord::new(1, 0, 0);
    let sneaky = Coord::new(2, 0, 0);
    c.prog(NS, spin, b"cube.rput(0, 0, 1, 'x') while true do end")
        .unwrap();
    c.prog(
        NS,
        bomb,
        b"local t = {} local s = string.rep('x', 4096) \
          for i = 1, 1e9 do t[i] = s .. i end",
    )
    .unwrap();
    // A program that tries to outlive its budget by catching the error.
    c.prog(
        NS,
        sneaky,
        b"while true do pcall(function() while true do end end) end",
    )
    .unwrap();

    // Another client keeps writing and reading meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let bystander = {
        let mut other = daemon.client().unwrap();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let at = Coord::new(100, (i % 50) as i32, 0);
                other.put(NS, at, format!("{i}").as_bytes()).unwrap();
                assert_eq!(
                    other.get(NS, at).unwrap().unwrap(),
                    format!("{i}").as_bytes()
                );
                worst = worst.max(started.elapsed());
                i += 1;
            }
            (i, worst)
        })
    };
    for _ in 0..3 {
        let err = run_err(&mut c, spin);
        assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{err}");
        let err = run_err(&mut c, bomb);
        assert_eq!(code(&err), Some(ErrorCode::ProgramMemory), "{err}");
        let err = run_err(&mut c, sneaky);
        assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{err}");
    }
    stop.store(true, Ordering::Relaxed);
    let (ops, worst) = bystander.join().unwrap();
    assert!(ops > 0);
    assert!(worst < HANG, "a bystander waited {worst:?}");
    // Nothing the runaway programs wrote was applied; all runs recorded.
    assert_eq!(c.get(NS, Coord::new(0, 0, 1)).unwrap(), None);
    for (at, outcome) in [
        (spin, RunOutcome::Fuel),
        (bomb, RunOutcome::Memory),
        (sneaky, RunOutcome::Fuel),
    ] {
        let stats = c.cell_stats(NS, at, 10).unwrap();
        assert_eq!((stats.runs, stats.failures), (3, 3), "{at}");
        assert!(
            stats.records.iter().all(|r| r.outcome == outcome),
            "{stats:?}"
        );
        assert!(stats.records.iter().all(|r| r.cells_written == 0));
    }
    let fuel = &c.cell_stats(NS, spin, 1).unwrap().records[0];
    assert!(fuel.instructions > 1_000_000, "{fuel:?}");
    // The VM is still healthy afterwards.
    c.prog(NS, spin, b"return 1 + 1").unwrap();
    assert_eq!(c.run(NS, spin, &[]).unwrap().value, ProgramValue::Int(2));
}

#[test]
fn telemetry_counts_are_exact_under_16_concurrent_clients() {
    let daemon = LocalDaemon::start_fresh(&["--program-telemetry-keep", "100"]).unwrap();
    let at = Coord::new(7, 7, 7);
    daemon
        .client()
        .unwrap()
        .prog(NS, at, b"return cube.rincr(0, 0, 0)")
        .unwrap();
    let per_client = 40;
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let mut c = daemon.client().unwrap();
            thread::spawn(move || {
                (0..per_client)
                    .map(|_| c.run(NS, at, &[]).unwrap().seq)
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    seqs.sort_unstable();
    let total = 16 * per_client as u64;
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "every seq once");
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get(NS, at).unwrap().unwrap(),
        total.to_string().as_bytes()
    );
    let stats = c.cell_stats(NS, at, 1000).unwrap();
    assert_eq!((stats.runs, stats.failures), (total, 0));
    let kept: Vec<u64> = stats.records.iter().map(|r| r.seq).collect();
    assert_eq!(kept, ((total - 99)..=total).collect::<Vec<_>>());
}

#[test]
fn programs_and_telemetry_survive_kill_9_restart_and_checkpoints() {
    let keep = 5;
    let daemon_args = ["--program-telemetry-keep", "5"];
    let mut daemon = LocalDaemon::start_fresh(&daemon_args).unwrap();
    let mut c = daemon.client().unwrap();
    let counter = Coord::new(0, 0, 0);
    let failing = Coord::new(1, 0, 0);
    c.prog(NS, counter, b"return cube.rincr(0, 0, 0)").unwrap();
    c.prog(NS, failing, b"error('always')").unwrap();
    let mut runs = 0u64;
    let mut run_both = |c: &mut Client, n: u64| {
        for _ in 0..n {
            c.run(NS, counter, &[]).unwrap();
            c.run(NS, failing, &[]).unwrap_err();
            runs += 1;
        }
        runs
    };
    let check = |c: &mut Client, runs: u64| {
        let stats = c.cell_stats(NS, counter, 100).unwrap();
        assert_eq!((stats.runs, stats.failures), (runs, 0));
        let seqs: Vec<u64> = stats.records.iter().map(|r| r.seq).collect();
        let first = runs.saturating_sub(keep - 1).max(1);
        assert_eq!(seqs, (first..=runs).collect::<Vec<_>>());
        assert_eq!(
            c.get(NS, counter).unwrap().unwrap(),
            runs.to_string().as_bytes()
        );
        let stats = c.cell_stats(NS, failing, 100).unwrap();
        assert_eq!((stats.runs, stats.failures), (runs, runs));
        assert!(stats.program_bytes.is_some());
    };
    let n = run_both(&mut c, 8);
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    check(&mut c, n);
    // Into a checkpoint (and a compacted base), then more WAL on top.
    let n = run_both(&mut c, 4);
    c.checkpoint(false).unwrap();
    let n2 = run_both(&mut c, 3);
    assert_eq!(n2, n + 3);
    c.checkpoint(true).unwrap();
    let n = run_both(&mut c, 2);
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    check(&mut c, n);
    // A clean shutdown folds everything into the checkpoint.
    drop(c);
    daemon.terminate().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    check(&mut c, n);
    assert_eq!(c.run(NS, counter, &[]).unwrap().seq, n + 1);
}

#[test]
fn every_sandbox_escape_is_refused() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(0, 0, 0);
    // (program, what the error must say); each must fail, and the cell
    // probe written first must not be applied.
    let escapes: &[(&str, &str)] = &[
        (
            "return io.open('/etc/passwd')",
            "attempt to index a nil value",
        ),
        ("return os.execute('true')", "attempt to index a nil value"),
        ("return debug.getinfo(1)", "attempt to index a nil value"),
        ("return package.loaded", "attempt to index a nil value"),
        (
            "return coroutine.create(print)",
            "attempt to index a nil value",
        ),
        ("return require('os')", "attempt to call a nil value"),
        ("return load('return 1')()", "attempt to call a nil value"),
        (
            "return loadstring('return 1')",
            "attempt to call a nil value",
        ),
        (
            "return dofile('/etc/passwd')",
            "attempt to call a nil value",
        ),
        (
            "return loadfile('/etc/passwd')",
            "attempt to call a nil value",
        ),
        (
            "return collectgarbage('count')",
            "attempt to call a nil value",
        ),
        ("print('hi')", "attempt to call a nil value"),
        ("return _G.os", "attempt to index a nil value"),
        (
            "return string.dump(function() end)",
            "attempt to call a nil value",
        ),
        ("return ('x').dump", "nil"),
        (
            "return string.gsub('aaa', 'a', 'b')",
            "string.gsub is not available",
        ),
        (
            "return string.match('aaa', 'a*')",
            "string.match is not available",
        ),
        ("return ('aaa'):find('a+')", "only plain search"),
        ("string.rep = nil", "string is read-only"),
        ("cube.get = function() end", "cube is read-only"),
        ("cube.ns = 'other'", "cube is read-only"),
        ("rawset(string, 'rep', nil)", "library tables are read-only"),
        ("rawset(math, 'pi', 3)", "library tables are read-only"),
        (
            "return getmetatable('').__index",
            "attempt to index a boolean value",
        ),
        ("setmetatable(string, {})", "protected metatable"),
        (
            "setmetatable({}, { __gc = function() end })",
            "__gc metamethods are not allowed",
        ),
        (
            "return cube.run(1, 2, 3)",
            "cannot run another cell's program",
        ),
        (
            "local ok = pcall(function() while true do end end) return ok",
            "out of fuel",
        ),
        (
            "while true do xpcall(function() while true do end end, function() end) end",
            "out of fuel",
        ),
        ("return ('x'):rep(1e12)", "out of"),
        // Seeding the generator every run shares would fix what another
        // namespace's programs draw.
        ("math.randomseed(42)", "math.randomseed is not available"),
        ("return ('') :rep(1e15) .. string.rep('', 1e15, '')", "nil"),
    ];
    let mut refused = 0;
    for (program, expected) in escapes {
        let source = format!("cube.put(9, 9, 9, 'probe')\n{program}");
        c.prog(NS, at, source.as_bytes()).unwrap();
        match c.run(NS, at, &[]) {
            Err(err) => {
                let text = err.to_string();
                assert!(text.contains(expected), "{program}: {text}");
                refused += 1;
            }
            // The empty-string case is harmless and must come back at once.
            Ok(reply) if *expected == "nil" => {
                assert!(
                    matches!(reply.value, ProgramValue::Bytes(ref b) if b.is_empty())
                        || reply.value == ProgramValue::Nil,
                    "{program}: {:?}",
                    reply.value
                );
                c.del(NS, Coord::new(9, 9, 9)).unwrap();
                continue;
            }
            Ok(reply) => panic!("{program} was not refused: {:?}", reply.value),
        }
        assert_eq!(c.get(NS, Coord::new(9, 9, 9)).unwrap(), None, "{program}");
    }
    assert!(refused >= escapes.len() - 2);
    // A binary chunk is refused at prog time, never stored.
    let err = c
        .prog(NS, at, b"\x1bLua\x54\x00\x19\x93\r\n\x1a\n")
        .unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::ProgramSyntax), "{err}");
    // Globals set by one run are gone in the next.
    c.prog(
        NS,
        at,
        b"local before = leaked leaked = 1 return before == nil",
    )
    .unwrap();
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Bool(true));
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Bool(true));
    // The environment table is reused between runs that leave it empty:
    // globals set with rawset, or by a run that then fails, are gone too,
    // and so is anything another cell's program left.
    let other = Coord::new(6, 6, 6);
    c.prog(
        NS,
        other,
        b"rawset(_ENV, 'leaked', 2) hidden = 3 error('after the writes')",
    )
    .unwrap();
    assert_eq!(code(&run_err(&mut c, other)), Some(ErrorCode::ProgramError));
    c.prog(
        NS,
        at,
        b"return leaked == nil and hidden == nil and rawget(_ENV, 'leaked') == nil",
    )
    .unwrap();
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Bool(true));
    c.prog(NS, other, b"leaked = 4 return leaked").unwrap();
    assert_eq!(c.run(NS, other, &[]).unwrap().value, ProgramValue::Int(4));
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Bool(true));
}

/// Runs `source` at `at` and returns the error and how long the run took.
fn timed_failure(c: &mut Client, at: Coord, source: &str) -> (ClientError, Duration) {
    c.prog(NS, at, source.as_bytes()).unwrap();
    let started = Instant::now();
    let err = c
        .run(NS, at, &[])
        .map(|reply| reply.value)
        .expect_err(source);
    (err, started.elapsed())
}

#[test]
fn library_loops_are_paid_for_whatever_form_their_sizes_take() {
    // A time backstop far away: only the fuel may stop these programs.
    let daemon = LocalDaemon::start_fresh(&["--program-time-ms", "20000"]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(0, 0, 0);
    let programs = [
        // Sizes given as numeric strings skipped the charge.
        "table.move({}, '1', '30000000', 1, {})",
        "return table.concat({}, ',', '1', '30000000')",
        "return table.unpack({}, '1', '30000000')",
        // A __len read twice: once for the charge, once more in C.
        "local t = setmetatable({}, {__len = function() return 30000000 end}) \
         table.remove(t, '1')",
        "local t = setmetatable({}, {__len = function() return 30000000 end}) \
         table.insert(t, '1', 0)",
        // Sorting long strings compares their bytes in every comparison.
        "local s = string.rep('a', 1 << 20) local t = {} for i = 1, 1000 do t[i] = s end \
         table.sort(t)",
    ];
    for source in programs {
        let (err, took) = timed_failure(&mut c, at, source);
        assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{source}: {err}");
        assert!(err.to_string().contains("out of fuel"), "{source}: {err}");
        assert!(took < HANG, "{source} took {took:?}");
    }
    // A deep __index chain made each element of one C loop cost thousands
    // of lookups (34 s for this move): such tables are copied element by
    // element in Lua, where the default time backstop sees every access.
    let backstop = LocalDaemon::start_fresh(&[]).unwrap();
    let mut b = backstop.client().unwrap();
    for source in [
        "local c = {} for i = 1, 1990 do c = setmetatable({}, {__index = c}) end \
         table.move(c, 1, 900000, 1, {})",
        "local c = {} for i = 1, 1990 do c = setmetatable({}, {__index = c}) end \
         return select('#', table.unpack(c, 1, 150000))",
    ] {
        let (err, took) = timed_failure(&mut b, at, source);
        assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{source}: {err}");
        assert!(took < HANG, "{source} took {took:?}");
    }
    // An empty string repeated looped in C for its count (2.8 s for 1e9,
    // for ever for 1e15); it is empty at once, whatever the count's form.
    for source in [
        "return #string.rep('', '1000000000')",
        "return #string.rep('', '1e15', '')",
        "return #(''):rep('0x7fffffffffffffff')",
    ] {
        c.prog(NS, at, source.as_bytes()).unwrap();
        let started = Instant::now();
        assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Int(0));
        assert!(started.elapsed() < HANG, "{source}");
    }
    // A __len that answers small first and huge after is read once.
    c.prog(
        NS,
        at,
        b"local n = 0 local t = setmetatable({}, {__len = function() n = n + 1 \
          return n == 1 and 1 or 30000000 end}) table.insert(t, 1, 0) return n",
    )
    .unwrap();
    let started = Instant::now();
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Int(1));
    assert!(started.elapsed() < HANG);
    // The wrappers still do what the library does.
    c.prog(
        NS,
        at,
        b"local t = {5, 3, 1, 4} table.insert(t, 2, 9) table.insert(t, '7') \
          local r = table.remove(t, 1) table.sort(t, function(a, b) return tonumber(a) < tonumber(b) end) \
          local m = setmetatable({}, {__index = function(_, k) return k * 2 end, \
          __len = function() return 3 end}) table.insert(m, 1, 'x') \
          return table.concat(t, ',') .. '|' .. r .. '|' .. select('#', table.unpack(t)) .. '|' \
          .. table.concat(table.move(t, 2, 4, 1, {}), ',') .. '|' .. table.concat(m, ',', 1, 4) \
          .. '|' .. string.rep('ab', '2', '-') .. '|' .. tostring(table.remove(m, 2))",
    )
    .unwrap();
    assert_eq!(
        c.run(NS, at, &[]).unwrap().value,
        ProgramValue::Bytes(b"1,3,4,7,9|5|5|3,4,7|x,2,4,6|ab-ab|2".to_vec())
    );
    c.prog(NS, at, b"return string.rep('a', 1.5)").unwrap();
    let err = run_err(&mut c, at);
    assert!(
        err.to_string()
            .contains("number has no integer representation"),
        "{err}"
    );
    // The daemon keeps serving.
    c.put(NS, Coord::new(5, 5, 5), b"still here").unwrap();
    assert_eq!(
        c.get(NS, Coord::new(5, 5, 5)).unwrap().unwrap(),
        b"still here"
    );
}

#[test]
fn a_plain_find_pays_for_its_worst_case() {
    let daemon = LocalDaemon::start_fresh(&["--program-time-ms", "20000"]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(0, 0, 0);
    // Every place matches all but the needle's last byte: quadratic in
    // one C call.
    for source in [
        "local h = string.rep('a', 1 << 19) local n = string.rep('a', 1 << 18) .. 'b' \
         return string.find(h, n, 1, true)",
        "local h = string.rep('a', 1 << 19) local n = string.rep('a', 1 << 18) .. 'b' \
         return h:find(n, '1', true)",
    ] {
        let (err, took) = timed_failure(&mut c, at, source);
        assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{source}: {err}");
        assert!(err.to_string().contains("out of fuel"), "{source}: {err}");
        assert!(took < HANG, "{source} took {took:?}");
    }
    // Ordinary searches are cheap and answer as before.
    c.prog(
        NS,
        at,
        b"local h = string.rep('x', 100000) .. 'needle' \
          return {string.find(h, 'needle', 1, true), ('hello world'):find('o w', -7, true), \
          ('abc'):find('', 10, true) == nil}",
    )
    .unwrap();
    let reply = c.run(NS, at, &[]).unwrap();
    assert_eq!(
        reply.value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), ProgramValue::Int(100_001)),
            (ProgramValue::Int(2), ProgramValue::Int(5)),
            (ProgramValue::Int(3), ProgramValue::Bool(true)),
        ])
    );
    assert!(reply.instructions < 100_000, "{}", reply.instructions);
}

#[test]
fn a_result_over_the_frame_fails_before_it_is_copied_whole() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let at = Coord::new(0, 0, 0);
    // 4096 references to one 1 MiB string: 4 GiB once copied, which the
    // conversion did before it compared the total with the frame.
    let source = "local s = string.rep('x', 1 << 20) local t = {} \
                  for i = 1, 4096 do t[i] = s end return t";
    let rss_before = rss_kib(daemon.pid());
    for _ in 0..2 {
        let (err, took) = timed_failure(&mut c, at, source);
        assert_eq!(code(&err), Some(ErrorCode::ProgramError), "{err}");
        assert!(
            err.to_string().contains("do not fit in one response frame"),
            "{err}"
        );
        assert!(took < HANG, "took {took:?}");
    }
    let grew_mib = rss_kib(daemon.pid()).saturating_sub(rss_before) / 1024;
    assert!(grew_mib < 256, "the daemon grew by {grew_mib} MiB");
    // A result that fits still comes back whole.
    c.prog(
        NS,
        at,
        b"local s = string.rep('x', 1 << 20) return {s, s, s}",
    )
    .unwrap();
    match c.run(NS, at, &[]).unwrap().value {
        ProgramValue::Table(entries) => assert_eq!(entries.len(), 3),
        other => panic!("{other:?}"),
    }
}

/// Regression guard: stock Lua orders strings with `strcoll` on each
/// zero-separated piece, so comparing two strings of millions of zero bytes
/// took tens of milliseconds inside one VM instruction, where no hook can
/// stop it; a loop of such comparisons held the writer (every client's
/// writes) for 6.7 s against a 250 ms backstop. cube's Lua compares bytes
/// with `memcmp` (third_party/lua-src/CUBE-PATCH.md): the backstop now
/// stops the loop near its setting, and the order is stock Lua's in the
/// "C" locale. That the patched Lua is the one linked is checked by
/// `server/tests/patched_lua.rs`; how soon the backstop stops the loop is
/// measured by `writer-bounds/run` (see [`HANG`]).
#[test]
fn comparing_long_strings_of_zero_bytes_cannot_hold_the_writer() {
    let daemon = LocalDaemon::start_fresh(&["--program-time-ms", "100"]).unwrap();
    let mut c = daemon.client().unwrap();
    let order = Coord::new(0, 0, 0);
    c.prog(
        NS,
        order,
        br#"local t = { "b", "a\0c", "a\0b", "a", "", "\0", "ab", "\255", "a\0" }
            table.sort(t)
            return { "a\0b" < "a\0c", "a" < "a\0", "a\0" < "a", "ab" > "a\0c",
                     "\255" > "a", "" < "\0", "abc" <= "abc", table.concat(t, "|") }"#,
    )
    .unwrap();
    let value = c.run(NS, order, &[]).unwrap().value;
    let ProgramValue::Table(entries) = value else {
        panic!("{value:?}")
    };
    let got: Vec<ProgramValue> = entries.into_iter().map(|(_, v)| v).collect();
    let t = ProgramValue::Bool(true);
    let f = ProgramValue::Bool(false);
    assert_eq!(
        got,
        vec![
            t.clone(),
            t.clone(),
            f,
            t.clone(),
            t.clone(),
            t.clone(),
            t,
            ProgramValue::Bytes(b"|\0|a|a\0|a\0b|a\0c|ab|b|\xff".to_vec()),
        ]
    );

    let zeros = Coord::new(1, 0, 0);
    c.prog(
        NS,
        zeros,
        b"local a = string.rep('\\0', 4000000) local b = a .. '\\0' \
          while a < b do end",
    )
    .unwrap();
    let started = Instant::now();
    let err = run_err(&mut c, zeros);
    let took = started.elapsed();
    assert_eq!(code(&err), Some(ErrorCode::ProgramFuel), "{err}");
    assert!(
        took < HANG,
        "a 100 ms backstop stopped the comparisons after {took:?}"
    );
}
