//! Guards `step` against a real cubed: every run reads the state from before the step, a failed run (an error, or writes past a quota) applies nothing while the others commit, every run is in its cell's telemetry, and bad boxes, unknown namespaces, huge boxes and the step's time budget get clear answers (the Game of Life by steps, across kill -9, is in program_examples.rs).
#![allow(clippy::unwrap_used)]

mod common;

use cube_client::{Client, Coord, ErrorCode, LocalDaemon, RunOutcome};

const NS: &str = "default";

/// Each cell takes its left neighbour's value (or loses its own when the
/// neighbour has none). Run in order within one generation, the values
/// would cascade; a step moves each exactly one cell.
const SHIFT_RIGHT: &[u8] = b"local v = cube.rget(-1, 0, 0)\n\
    if v == nil then cube.rdel(0, 0, 0) else cube.rput(0, 0, 0, v) end\n\
    return v";

fn values(c: &mut Client, xs: std::ops::RangeInclusive<i32>) -> Vec<Option<String>> {
    xs.map(|x| {
        c.get(NS, Coord::new(x, 0, 0))
            .unwrap()
            .map(|v| String::from_utf8(v).unwrap())
    })
    .collect()
}

#[test]
fn every_run_of_a_step_reads_the_state_from_before_the_step() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for x in 0..8 {
        c.put(NS, Coord::new(x, 0, 0), format!("v{x}").as_bytes())
            .unwrap();
        c.prog(NS, Coord::new(x, 0, 0), SHIFT_RIGHT).unwrap();
    }
    // A program outside the box does not run.
    c.prog(NS, Coord::new(9, 0, 0), SHIFT_RIGHT).unwrap();
    let reply = c
        .step(NS, Coord::new(0, 0, 0), Coord::new(7, 0, 0), &[])
        .unwrap();
    assert_eq!(
        (reply.programs, reply.failed, reply.cells_written),
        (8, 0, 8)
    );
    assert!(reply.lsn > 0 && reply.first_failure.is_none(), "{reply:?}");
    let mut expected: Vec<Option<String>> = vec![None];
    expected.extend((0..7).map(|x| Some(format!("v{x}"))));
    expected.extend([None, None]);
    assert_eq!(values(&mut c, 0..=9), expected);
    // Each run is in its cell's telemetry, once; the cell outside is not.
    for x in 0..8 {
        let stats = c.cell_stats(NS, Coord::new(x, 0, 0), 10).unwrap();
        assert_eq!((stats.runs, stats.failures), (1, 0), "x = {x}");
        assert_eq!(stats.records[0].outcome, RunOutcome::Ok);
        assert_eq!(stats.records[0].cells_written, 1);
    }
    assert_eq!(c.cell_stats(NS, Coord::new(9, 0, 0), 10).unwrap().runs, 0);
    // A second step moves everything one more cell.
    c.step(NS, Coord::new(0, 0, 0), Coord::new(7, 0, 0), &[])
        .unwrap();
    let mut expected: Vec<Option<String>> = vec![None, None];
    expected.extend((0..6).map(|x| Some(format!("v{x}"))));
    assert_eq!(values(&mut c, 0..=7), expected);
}

#[test]
fn a_failed_run_applies_nothing_while_the_others_commit() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let counter = b"cube.rput(0, 0, 1, 'written')\nreturn cube.rincr(0, 0, 0)";
    let failing = b"cube.rput(0, 0, 1, 'written')\nerror('no ' .. cube.x)";
    for x in 0..4 {
        let source: &[u8] = if x == 2 { failing } else { counter };
        c.prog(NS, Coord::new(x, 0, 0), source).unwrap();
    }
    let reply = c
        .step(NS, Coord::new(0, 0, 0), Coord::new(3, 0, 0), &[b"ignored"])
        .unwrap();
    assert_eq!(
        (reply.programs, reply.failed, reply.cells_written),
        (4, 1, 6)
    );
    let failure = reply.first_failure.unwrap();
    assert_eq!((failure.coord, failure.seq), (Coord::new(2, 0, 0), 1));
    assert_eq!(failure.outcome, RunOutcome::Error);
    assert!(failure.message.contains("no 2"), "{failure:?}");
    for x in 0..4 {
        let (value, written) = (
            c.get(NS, Coord::new(x, 0, 0)).unwrap(),
            c.get(NS, Coord::new(x, 0, 1)).unwrap(),
        );
        let stats = c.cell_stats(NS, Coord::new(x, 0, 0), 10).unwrap();
        if x == 2 {
            assert_eq!((value, written), (None, None));
            assert_eq!((stats.runs, stats.failures), (1, 1));
            assert_eq!(stats.records[0].outcome, RunOutcome::Error);
        } else {
            assert_eq!(value.as_deref(), Some(&b"1"[..]));
            assert_eq!(written.as_deref(), Some(&b"written"[..]));
            assert_eq!((stats.runs, stats.failures), (1, 0));
        }
    }
}

#[test]
fn bad_boxes_unknown_namespaces_and_empty_boxes_get_clear_answers() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let err = c
        .step(NS, Coord::new(5, 0, 0), Coord::new(1, 0, 0), &[])
        .unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::InvalidArgument), "{err}");
    assert!(err.to_string().contains("x0 = 5 is above x1 = 1"), "{err}");
    let err = c
        .step("nowhere", Coord::new(0, 0, 0), Coord::new(1, 1, 1), &[])
        .unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::NoSuchNamespace), "{err}");
    // The whole of space, holding no program: nothing runs, nothing is
    // written, and the answer does not cost the box's volume.
    let all = (
        Coord::new(i32::MIN, i32::MIN, i32::MIN),
        Coord::new(i32::MAX, i32::MAX, i32::MAX),
    );
    let reply = c.step(NS, all.0, all.1, &[]).unwrap();
    assert_eq!((reply.programs, reply.lsn, reply.cells_written), (0, 0, 0));
    // ... and with one program far out, exactly that one runs.
    let far = Coord::new(i32::MIN, 7, i32::MAX);
    c.prog(NS, far, b"cube.rput(0, 0, 0, 'here')").unwrap();
    let reply = c.step(NS, all.0, all.1, &[]).unwrap();
    assert_eq!((reply.programs, reply.cells_written), (1, 1));
    assert_eq!(c.get(NS, far).unwrap().as_deref(), Some(&b"here"[..]));
}

#[test]
fn runs_past_the_steps_time_budget_fail_as_out_of_fuel_without_running() {
    // Fuel enough for seconds: the clock stops these runs.
    let daemon =
        LocalDaemon::start_fresh(&["--program-step-ms", "20", "--program-fuel", "100000000000"])
            .unwrap();
    let mut c = daemon.client().unwrap();
    // Each run would spin until its own budget (250 ms) stops it.
    let spin = b"cube.rput(0, 0, 1, 'x')\nwhile true do end";
    for x in 0..5 {
        c.prog(NS, Coord::new(x, 0, 0), spin).unwrap();
    }
    let reply = c
        .step(NS, Coord::new(0, 0, 0), Coord::new(4, 0, 0), &[])
        .unwrap();
    assert_eq!(
        (reply.programs, reply.failed, reply.cells_written),
        (5, 5, 0)
    );
    assert_eq!(reply.first_failure.unwrap().outcome, RunOutcome::Fuel);
    let mut not_started = 0;
    for x in 0..5 {
        assert_eq!(c.get(NS, Coord::new(x, 0, 1)).unwrap(), None);
        let stats = c.cell_stats(NS, Coord::new(x, 0, 0), 10).unwrap();
        assert_eq!((stats.runs, stats.failures), (1, 1), "x = {x}");
        assert_eq!(stats.records[0].outcome, RunOutcome::Fuel);
        if stats.records[0].message.contains("did not run") {
            not_started += 1;
        }
    }
    // The first run spins until the step's deadline; the others never
    // start.
    assert_eq!(not_started, 4);
    // The daemon goes on serving.
    c.put(NS, Coord::new(0, 0, 9), b"fine").unwrap();
}

#[test]
fn programs_far_apart_read_the_same_state_as_programs_close_together() {
    // Two groups of shifting cells a million cells apart: their bounding
    // box is too big for the step's snapshot, so the runs read the store,
    // and must see the same pre-step state.
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for base in [0, 1_000_000] {
        for x in 0..4 {
            let at = Coord::new(base + x, 0, 0);
            c.put(NS, at, format!("v{x}").as_bytes()).unwrap();
            c.prog(NS, at, SHIFT_RIGHT).unwrap();
        }
    }
    let reply = c
        .step(NS, Coord::new(0, 0, 0), Coord::new(1_000_003, 0, 0), &[])
        .unwrap();
    assert_eq!((reply.programs, reply.failed), (8, 0));
    for base in [0, 1_000_000] {
        let got: Vec<Option<Vec<u8>>> = (0..4)
            .map(|x| c.get(NS, Coord::new(base + x, 0, 0)).unwrap())
            .collect();
        assert_eq!(
            got,
            [
                None,
                Some(b"v0".to_vec()),
                Some(b"v1".to_vec()),
                Some(b"v2".to_vec())
            ],
            "base {base}"
        );
    }
}

#[test]
fn the_runs_of_a_step_share_one_transactions_room_for_writes() {
    // Five runs of 16 384 writes each (a run's own limit) do not fit one
    // transaction beside their five records: the runs that would pass it
    // fail, and the others' writes commit.
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let writer = b"for i = 1, 16384 do cube.put(cube.x, i, 1, 'v') end";
    for x in 0..5 {
        c.prog(NS, Coord::new(x, 0, 0), writer).unwrap();
    }
    let reply = c
        .step(NS, Coord::new(0, 0, 0), Coord::new(4, 0, 0), &[])
        .unwrap();
    assert_eq!(
        (reply.programs, reply.failed, reply.cells_written),
        (5, 2, 3 * 16_384),
        "{reply:?}"
    );
    let failure = reply.first_failure.unwrap();
    assert_eq!(failure.coord, Coord::new(3, 0, 0));
    assert!(
        failure
            .message
            .contains("the runs of one step together may write at most 16379 cells"),
        "{failure:?}"
    );
    assert_eq!(
        c.get(NS, Coord::new(2, 16_384, 1)).unwrap().as_deref(),
        Some(&b"v"[..])
    );
    assert_eq!(c.get(NS, Coord::new(3, 1, 1)).unwrap(), None);
    assert_eq!(c.get(NS, Coord::new(4, 1, 1)).unwrap(), None);
    // Alone in its step, a run meets its own limit first, and is told so.
    let greedy = b"for i = 1, 16385 do cube.put(cube.x, i, 1, 'v') end";
    c.prog(NS, Coord::new(9, 0, 0), greedy).unwrap();
    let reply = c
        .step(NS, Coord::new(9, 0, 0), Coord::new(9, 0, 0), &[])
        .unwrap();
    let message = reply.first_failure.unwrap().message;
    assert!(
        message.contains("a run may write at most 16384 cells"),
        "{message}"
    );
}

/// Regression guard: a step whose runs together went past a namespace quota
/// was refused whole by the writer, telemetry records included, although
/// each run is atomic on its own and every run must be recorded. The runs'
/// writes are now applied one run at a time, in the step's order; a run
/// that would go past the quota is undone alone and recorded as failed.
#[test]
fn runs_past_a_quota_fail_alone_and_are_recorded() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    common::create_with_max_cells(&mut c, "small", 3);
    for x in 0..6 {
        c.prog("small", Coord::new(x, 0, 0), b"cube.rput(0, 0, 1, 'w')")
            .unwrap();
    }
    let reply = c
        .step("small", Coord::new(0, 0, 0), Coord::new(5, 0, 0), &[])
        .unwrap();
    assert_eq!(
        (reply.programs, reply.failed, reply.cells_written),
        (6, 3, 3),
        "{reply:?}"
    );
    let failure = reply.first_failure.unwrap();
    assert_eq!(failure.outcome, RunOutcome::Error);
    assert!(failure.message.contains("max-cells quota"), "{failure:?}");
    let mut written = 0;
    for x in 0..6 {
        let value = c.get("small", Coord::new(x, 0, 1)).unwrap();
        let stats = c.cell_stats("small", Coord::new(x, 0, 0), 1).unwrap();
        assert_eq!(stats.runs, 1, "every run is recorded");
        match value {
            Some(_) => {
                written += 1;
                assert_eq!(stats.failures, 0);
                assert_eq!(stats.records[0].cells_written, 1);
            }
            None => {
                assert_eq!(stats.failures, 1);
                assert_eq!(stats.records[0].outcome, RunOutcome::Error);
                assert_eq!(stats.records[0].cells_written, 0);
            }
        }
    }
    assert_eq!(written, 3);
    // The same after kill -9: what was acknowledged is what is on disk.
    let mut daemon = daemon;
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    let kept = (0..6)
        .filter(|x| c.get("small", Coord::new(*x, 0, 1)).unwrap().is_some())
        .count();
    assert_eq!(kept, 3);
    assert_eq!(
        c.cell_stats("small", Coord::new(5, 0, 0), 0).unwrap().runs,
        1
    );
}

/// An odd-neighbourhood rule written in place: correct only if every run
/// reads the generation before the step, whatever thread it ran on.
const ODD_RULE: &[u8] = b"local n = cube.rcount(-1, -1, -1, 1, 1, 1)\n\
    if n % 2 == 1 then cube.rput(0, 0, 0, '1') else cube.rdel(0, 0, 0) end\n\
    return n";

/// A daemon whose steps run on `threads` threads, with `source` stored at
/// every cell of a 32 x 16 x 4 box (2 048 programs: enough for two lanes)
/// and a pseudo-random soup of live cells.
fn step_box(threads: &str, source: &[u8]) -> (LocalDaemon, Client) {
    step_box_with(&["--program-step-threads", threads], source)
}

/// [`step_box`] with the daemon's flags given.
fn step_box_with(flags: &[&str], source: &[u8]) -> (LocalDaemon, Client) {
    let daemon = LocalDaemon::start_fresh(flags).unwrap();
    let mut c = daemon.client().unwrap();
    for x in 0..32 {
        for y in 0..16 {
            for z in 0..4 {
                let at = Coord::new(x, y, z);
                c.prog(NS, at, source).unwrap();
                if (x * 7 + y * 13 + z * 5) % 3 == 0 {
                    c.put(NS, at, b"1").unwrap();
                }
            }
        }
    }
    (daemon, c)
}

fn step_all(c: &mut Client, args: &[&[u8]]) -> cube_client::StepReply {
    c.step(NS, Coord::new(0, 0, 0), Coord::new(31, 15, 3), args)
        .unwrap()
}

#[test]
fn a_step_on_several_threads_computes_what_one_thread_computes() {
    let (_one, mut one) = step_box("1", ODD_RULE);
    let (_two, mut two) = step_box("2", ODD_RULE);
    for generation in 0..3 {
        let (a, b) = (step_all(&mut one, &[]), step_all(&mut two, &[]));
        assert_eq!(
            (a.programs, a.failed, a.cells_written, a.instructions),
            (b.programs, b.failed, b.cells_written, b.instructions),
            "generation {generation}"
        );
        assert_eq!((a.programs, a.failed), (2048, 0));
    }
    let mut live = 0;
    for x in 0..32 {
        for y in 0..16 {
            for z in 0..4 {
                let at = Coord::new(x, y, z);
                let value = one.get(NS, at).unwrap();
                assert_eq!(value, two.get(NS, at).unwrap(), "cell {at}");
                live += usize::from(value.is_some());
                if (x + y + z) % 37 == 0 {
                    let (a, b) = (
                        one.cell_stats(NS, at, 3).unwrap(),
                        two.cell_stats(NS, at, 3).unwrap(),
                    );
                    assert_eq!((a.runs, b.runs), (3, 3), "cell {at}");
                    let written = |s: &cube_client::CellStats| {
                        s.records
                            .iter()
                            .map(|r| r.cells_written)
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(written(&a), written(&b), "cell {at}");
                }
            }
        }
    }
    assert!(live > 0 && live < 2048, "{live} live cells: a dull soup");
    assert_eq!(common::stat(&mut one, "programs.steps_parallel"), 0);
    assert_eq!(common::stat(&mut two, "programs.steps_parallel"), 3);
    assert_eq!(common::stat(&mut two, "programs.steps_redone"), 0);
}

#[test]
fn runs_near_the_steps_caps_come_out_as_on_one_thread() {
    // 2 048 runs of 32 writes each are 65 536 writes, past the 63 488 the
    // step leaves beside its records: on one thread the runs after the
    // first 1 984 are refused. Each lane alone fits, so the lanes' work
    // must be dropped and the step done again on one thread.
    let writer = b"for i = 1, 32 do cube.rput(0, 0, 10 + i, 'v') end";
    let (_one, mut one) = step_box("1", writer);
    let (_two, mut two) = step_box("2", writer);
    let (a, b) = (step_all(&mut one, &[]), step_all(&mut two, &[]));
    assert_eq!(
        (a.programs, a.failed, a.cells_written),
        (2048, 64, 1984 * 32)
    );
    assert_eq!(
        (a.programs, a.failed, a.cells_written),
        (b.programs, b.failed, b.cells_written)
    );
    let (fa, fb) = (a.first_failure.unwrap(), b.first_failure.unwrap());
    assert_eq!((fa.coord, &fa.message), (fb.coord, &fb.message));
    assert!(
        fa.message
            .contains("the runs of one step together may write at most 0 cells"),
        "{fa:?}"
    );
    assert_eq!(common::stat(&mut two, "programs.steps_parallel"), 1);
    assert_eq!(common::stat(&mut two, "programs.steps_redone"), 1);
}

#[test]
fn every_run_of_a_step_sees_its_own_coordinate() {
    // The API table's x, y and z are set only where they changed since the
    // last run; in curve order, runs change one, two or three of them.
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    let source = b"cube.rput(0, 0, 0, cube.x .. ',' .. cube.y .. ',' .. cube.z)";
    let cells: Vec<Coord> = (-1..=1)
        .flat_map(|x| (-1..=1).flat_map(move |y| (-1..=1).map(move |z| Coord::new(x, y, z))))
        .collect();
    for at in &cells {
        c.prog(NS, *at, source).unwrap();
    }
    let reply = c
        .step(NS, Coord::new(-1, -1, -1), Coord::new(1, 1, 1), &[])
        .unwrap();
    assert_eq!((reply.programs, reply.failed), (27, 0));
    for at in &cells {
        let own = format!("{},{},{}", at.x, at.y, at.z);
        assert_eq!(c.get(NS, *at).unwrap(), Some(own.into_bytes()), "{at}");
    }
}

/// Every cell of the 32 x 16 x 4 box of [`step_box`], in x, y, z order.
fn box_cells(c: &mut Client) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for x in 0..32 {
        for y in 0..16 {
            for z in 0..4 {
                out.push(c.get(NS, Coord::new(x, y, z)).unwrap());
            }
        }
    }
    out
}

/// Regression guard: fuel is metered by a hook every 1000 instructions,
/// and its count carried over from run to run in one VM, so a run near
/// its budget passed or failed by where the VM's earlier runs left the
/// count; a step lane's new VM left it elsewhere than the writer's. Each
/// run now starts the count over.
#[test]
fn runs_near_their_fuel_budget_end_alike_on_one_thread_and_on_several() {
    // About 1 500 instructions: the hook fires once, at 1 000 (the whole
    // budget, not past it), then the run ends.
    let source = b"local s = 0 for i = 1, 700 do s = s + i end cube.rput(0, 0, 0, 'ok')";
    let flags = |threads| ["--program-step-threads", threads, "--program-fuel", "1000"];
    let (_one, mut one) = step_box_with(&flags("1"), source);
    let (_two, mut two) = step_box_with(&flags("2"), source);
    for _ in 0..2 {
        let (a, b) = (step_all(&mut one, &[]), step_all(&mut two, &[]));
        assert_eq!((a.failed, a.instructions), (0, 2048 * 1000), "{a:?}");
        assert_eq!((b.failed, b.instructions), (0, 2048 * 1000), "{b:?}");
    }
    assert_eq!(box_cells(&mut one), box_cells(&mut two));
    assert_eq!(common::stat(&mut two, "programs.steps_parallel"), 2);
}

/// Regression guard: a program was compiled inside its first run's memory
/// budget, so a run near the budget failed in a step lane's new VM (which
/// compiles every source afresh) and not on the writer (whose cache held
/// it). Compiling is now outside the run's budgets.
#[test]
fn compiling_does_not_count_against_a_runs_memory() {
    // A 25 KB constant in the source, and a run that allocates 29 KB of
    // a 64 KiB budget: past it only if the compile counts.
    let mut source = b"local big = '".to_vec();
    source.extend(std::iter::repeat_n(b'q', 25_000));
    source.extend(b"' local made = string.rep('y', 29000) cube.rput(0, 0, 0, 'ok')");
    let flags = |threads| {
        [
            "--program-step-threads",
            threads,
            "--program-memory",
            "65536",
        ]
    };
    let (_one, mut one) = step_box_with(&flags("1"), &source);
    let (_two, mut two) = step_box_with(&flags("2"), &source);
    for _ in 0..2 {
        let (a, b) = (step_all(&mut one, &[]), step_all(&mut two, &[]));
        assert_eq!((a.failed, b.failed), (0, 0), "{a:?} {b:?}");
    }
}
