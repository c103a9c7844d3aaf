//! Cell programs written to hold the writer thread (issue 30, A and B): a
//! message handler that never returns, library calls that work on
//! megabytes inside one instruction, and `tostring`'s heap addresses.
//! Each runs against a real cubed and must end with a budget error within
//! a generous bound of `--program-time-ms`, while a bystander's write in
//! another namespace completes. The bound only catches a hang or a large
//! overrun (before the fixes these ran for ever, or 47-80x the limit).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Client, ClientError, Coord, ErrorCode, LocalDaemon, ProgramValue, RunOutcome};

const NS: &str = "default";
/// The namespace of the bystander's writes.
const OTHER: &str = "bystander";
const TIME_LIMIT_MS: u64 = 250;

/// A run (or step) must answer within this: ten times the time limit.
fn bound() -> Duration {
    Duration::from_millis(10 * TIME_LIMIT_MS)
}

/// A daemon with the given time limit, a program at `at` and the
/// bystander's namespace.
fn daemon_with(source: &str, at: Coord) -> (LocalDaemon, Client) {
    let limit = TIME_LIMIT_MS.to_string();
    let daemon = LocalDaemon::start_fresh(&["--program-time-ms", &limit]).unwrap();
    let mut c = daemon.client().unwrap();
    common::create_with_max_cells(&mut c, OTHER, 1000);
    c.prog(NS, at, source.as_bytes()).unwrap();
    (daemon, c)
}

/// Runs `f` on its own thread and waits for it at most `bound`; a hang
/// fails the test (the daemon is then killed by its drop, which ends `f`).
fn within<T: Send + 'static>(
    what: &str,
    bound: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(bound) {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {bound:?}: the writer is held"),
    }
}

/// Runs the program at `at` and, meanwhile, a put in another namespace;
/// both must finish within the bound. Returns the run's error.
fn run_with_bystander(daemon: &LocalDaemon, c: Client, at: Coord) -> ClientError {
    let mut c = c;
    let run = thread::spawn(move || {
        let started = Instant::now();
        let result = c.run(NS, at, &[]).map(|reply| reply.value);
        (result, started.elapsed())
    });
    let mut other = daemon.client().unwrap();
    within("a bystander's put", bound(), move || {
        other
            .put(OTHER, Coord::new(1, 2, 3), b"still writing")
            .unwrap();
    });
    let (result, took) = within("the run", bound(), move || run.join().unwrap());
    assert!(took < bound(), "the run took {took:?}");
    result.expect_err("a hostile program must fail")
}

fn assert_out_of_time_or_fuel(err: &ClientError, source: &str) {
    assert_eq!(
        err.server_code(),
        Some(ErrorCode::ProgramFuel),
        "{source}: {err}"
    );
}

/// A.1: the instruction hook's error ran the program's message handler
/// with hooks off, so a handler that loops was never stopped.
#[test]
fn a_message_handler_that_loops_cannot_hold_the_writer() {
    let at = Coord::new(0, 0, 0);
    for source in [
        // The hook's error (fuel or time) calls the handler.
        "return xpcall(function() while true do end end, function() while true do end end)",
        // An ordinary error calls the handler with hooks on; its loop is
        // stopped by the hook, whose error calls the handler again.
        "return xpcall(function() error('x') end, function() while true do end end)",
        // A handler that runs long, but not for ever, after the budget.
        "return xpcall(function() while true do end end, \
         function(e) for i = 1, 1e10 do end return e end)",
        // Nested protected calls each with their own looping handler.
        "return xpcall(function() return xpcall(function() while true do end end, \
         function() while true do end end) end, function() while true do end end)",
        // pcall inside the handler cannot restart the count either.
        "return xpcall(function() while true do end end, \
         function() pcall(function() while true do end end) while true do end end)",
    ] {
        let (daemon, c) = daemon_with(source, at);
        let err = run_with_bystander(&daemon, c, at);
        assert_out_of_time_or_fuel(&err, source);
    }
}

/// A.2: the same program run by `step` (on the writer, or a step lane).
#[test]
fn a_looping_message_handler_in_a_step_cannot_hold_the_writer() {
    let source =
        "return xpcall(function() while true do end end, function() while true do end end)";
    let (daemon, mut c) = daemon_with(source, Coord::new(0, 0, 0));
    for x in 1..4 {
        c.prog(NS, Coord::new(x, 0, 0), source.as_bytes()).unwrap();
    }
    let mut other = daemon.client().unwrap();
    let step = thread::spawn(move || {
        c.step(NS, Coord::new(0, 0, 0), Coord::new(3, 0, 0), &[])
            .unwrap()
    });
    within("a bystander's put", bound() * 4, move || {
        other.put(OTHER, Coord::new(0, 0, 0), b"x").unwrap();
    });
    let reply = within("the step", bound() * 4, move || step.join().unwrap());
    assert_eq!((reply.programs, reply.failed), (4, 4), "{reply:?}");
    let failure = reply.first_failure.unwrap();
    assert_eq!(failure.outcome, RunOutcome::Fuel, "{failure:?}");
}

/// A.3: the daemon stops on the first SIGTERM after such a run (the
/// writer is free to see the shutdown).
#[test]
fn the_first_sigterm_stops_the_daemon_after_a_looping_handler() {
    let at = Coord::new(0, 0, 0);
    let (mut daemon, c) = daemon_with(
        "return xpcall(function() while true do end end, function() while true do end end)",
        at,
    );
    let err = run_with_bystander(&daemon, c, at);
    assert_out_of_time_or_fuel(&err, "xpcall");
    let status = daemon.terminate().unwrap();
    assert!(status.success(), "{status:?}");
}

/// A handler still works for ordinary errors: it sees the error and its
/// result is xpcall's.
#[test]
fn a_message_handler_still_handles_ordinary_errors() {
    let at = Coord::new(0, 0, 0);
    let (_daemon, mut c) = daemon_with(
        "local ok, e = xpcall(function() error('boom', 0) end, function(m) return 'handled ' .. m end) \
         local ok2, e2 = pcall(error, 'plain', 0) \
         return tostring(ok) .. '|' .. e .. '|' .. tostring(ok2) .. '|' .. e2",
        at,
    );
    assert_eq!(
        c.run(NS, at, &[]).unwrap().value,
        ProgramValue::Bytes(b"false|handled boom|false|plain".to_vec())
    );
    c.prog(NS, at, b"return xpcall(print, 42)").unwrap();
    let err = c.run(NS, at, &[]).unwrap_err();
    assert!(err.to_string().contains("xpcall"), "{err}");
}

/// B: library calls and VM operations that loop over megabytes inside one
/// call or instruction. Each held the writer 0.3-20 s against a 250 ms
/// limit; each now pays fuel for its input before (or, where the input
/// decides how far it goes, right after) the loop, so the run stops near
/// its limit.
#[test]
fn one_slow_library_call_after_another_cannot_overrun_the_time_limit() {
    let at = Coord::new(0, 0, 0);
    let programs = [
        "local s = string.rep('\\0', 1e6) while true do local u = string.format('%q', s) end",
        "local s = string.rep('z', 3e6) while true do local u = tonumber(s, 36) end",
        "local s = string.rep('9', 3e6) while true do local u = tonumber(s) end",
        "local s = string.rep('a', 3e6) while true do local u = s:upper() end",
        "local s = string.rep('a', 3e6) while true do local u = s:lower() end",
        "local s = string.rep('a', 3e6) while true do local u = s:reverse() end",
        "local s = string.rep('a', 3e6) while true do local u = s:sub(2) end",
        "local s = string.rep('a', 3e6) while true do local u = s:byte(1, 100000) end",
        "local s = string.rep('a', 3e6) while true do local u = string.format('%s', s) end",
        "local s = string.rep('a', 3e6) while true do local u = utf8.len(s) end",
        "local s = string.rep('a', 3e6) while true do local u = utf8.offset(s, -1) end",
        "local s = string.rep('\\x80', 3e6) local f = utf8.codes('a') \
         while true do local u = f(s, 0) end",
        "local s = string.rep('a', 3e6) while true do local u = string.unpack('z', s .. '\\0') end",
        "local a = string.rep('\\0', 3e6) local b = a .. '\\0' while true do local u = a < b end",
        "local a = string.rep('\\0', 3e6) local b = string.rep('\\0', 3e6) \
         while true do local u = a == b end",
        "local a = string.rep('\\0', 3e6) local b = string.rep('\\0', 3e6) \
         while true do local u = rawequal(a, b) end",
        "local s = string.rep('a', 3e6) while true do local u = s .. 'y' end",
        "local t = {} for i = 1, 100 do t[i] = string.rep('a', 3e4) end \
         while true do local u = table.concat(t) end",
        // A long string hashed as a key, once per new string.
        "local s = string.rep('a', 3e6) local t = {} while true do local u = t[s:sub(2)] end",
        // Instructions that copy every value of a long argument list.
        "local t = {} for i = 1, 200000 do t[i] = i end \
         local function f(...) while true do local a = {...} end end f(table.unpack(t))",
        "local t = {} for i = 1, 200000 do t[i] = i end local function g(...) return ... end \
         local function f(...) while true do g(...) end end f(table.unpack(t))",
    ];
    let limit = TIME_LIMIT_MS.to_string();
    // Fuel far away: only the time limit may stop these programs, so each
    // shows that the limit is checked between the slow calls.
    let daemon = LocalDaemon::start_fresh(&[
        "--program-time-ms",
        &limit,
        "--program-fuel",
        "1000000000000",
        "--program-memory",
        "67108864",
    ])
    .unwrap();
    let mut c = daemon.client().unwrap();
    common::create_with_max_cells(&mut c, OTHER, 1000);
    for source in programs {
        c.prog(NS, at, source.as_bytes()).unwrap();
        let fresh = daemon.client().unwrap();
        let err = run_with_bystander(&daemon, fresh, at);
        assert_out_of_time_or_fuel(&err, source);
        assert!(err.to_string().contains("out of time"), "{source}: {err}");
    }
}

/// B: with the default fuel, one call whose charge is past the run's fuel
/// fails before it does the work.
#[test]
fn a_call_past_the_fuel_fails_before_its_work() {
    let at = Coord::new(0, 0, 0);
    let source = "local s = string.rep('\\0', 3e6) return #string.format('%q', s)";
    let (daemon, c) = daemon_with(source, at);
    let err = run_with_bystander(&daemon, c, at);
    assert!(err.to_string().contains("out of fuel"), "{err}");
}

/// Long numeric strings are not numbers (their conversion scanned them
/// whole inside one instruction); short ones still are.
#[test]
fn only_numbers_of_at_most_200_bytes_convert() {
    let at = Coord::new(0, 0, 0);
    let (_daemon, mut c) = daemon_with(
        "return { tonumber(string.rep('9', 200)) ~= nil, tonumber(string.rep('9', 201)) == nil, \
          tonumber('ff', 16), tonumber(string.rep('1', 201), 2) == nil, '10' + 1, \
          utf8.len('añb'), ('abc'):upper(), string.format('%q', 'a\\0b') }",
        at,
    );
    let value = c.run(NS, at, &[]).unwrap().value;
    let ProgramValue::Table(entries) = value else {
        panic!("{value:?}")
    };
    let got: Vec<ProgramValue> = entries.into_iter().map(|(_, v)| v).collect();
    assert_eq!(
        got,
        vec![
            ProgramValue::Bool(true),
            ProgramValue::Bool(true),
            ProgramValue::Int(255),
            ProgramValue::Bool(true),
            ProgramValue::Int(11),
            ProgramValue::Int(3),
            ProgramValue::Bytes(b"ABC".to_vec()),
            ProgramValue::Bytes(b"\"a\\0b\"".to_vec()),
        ]
    );
}

/// `tostring` of a table or function, and `%p`, showed heap addresses.
#[test]
fn tostring_shows_no_heap_address() {
    let at = Coord::new(0, 0, 0);
    let (_daemon, mut c) = daemon_with(
        "return tostring({}) .. '|' .. tostring(print or tostring) .. '|' .. \
         string.format('%s', function() end) .. '|' .. \
         tostring(setmetatable({}, {__tostring = function() return 'mine' end}))",
        at,
    );
    assert_eq!(
        c.run(NS, at, &[]).unwrap().value,
        ProgramValue::Bytes(b"table|function|function|mine".to_vec())
    );
    c.prog(NS, at, b"return string.format('%p', {})").unwrap();
    let err = c.run(NS, at, &[]).unwrap_err();
    assert!(err.to_string().contains("addresses are hidden"), "{err}");
}

/// A `__close` method ran where no hook could stop it: when the count
/// hook raised the budget's error, mlua reset the stack inside the hook,
/// which closed the running function's variables with hooks off, and a
/// looping `__close` held the writer for ever. Programs cannot make
/// to-be-closed variables (`nil` and `false` still may be marked).
#[test]
fn a_close_method_cannot_hold_the_writer() {
    let at = Coord::new(0, 0, 0);
    for source in [
        "local x <close> = setmetatable({}, {__close = function() while true do end end}) \
         while true do end",
        "for k in next, {}, nil, setmetatable({}, {__close = function() while true do end end}) \
         do end while true do end",
    ] {
        let (daemon, c) = daemon_with(source, at);
        let err = run_with_bystander(&daemon, c, at);
        assert_eq!(err.server_code(), Some(ErrorCode::ProgramError), "{err}");
        assert!(
            err.to_string()
                .contains("to-be-closed variables are not available"),
            "{err}"
        );
    }
    let (_daemon, mut c) =
        daemon_with("local x <close> = nil local y <close> = false return 1", at);
    assert_eq!(c.run(NS, at, &[]).unwrap().value, ProgramValue::Int(1));
}
