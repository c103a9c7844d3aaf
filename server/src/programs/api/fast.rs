//! The API's common calls answered by a raw Lua C function (`F` in the
//! prelude) instead of the mlua dispatcher (`D`).
//!
//! Why: a call through mlua's callback machinery (its protected call, the
//! conversion of eight `Value`s, their references) costs more than the
//! work of a `get` from a step's snapshot, and a Game of Life rule makes
//! four calls per run. `F` reads integers and strings straight off the Lua
//! stack and answers with plain values.
//!
//! `F` answers only what it can answer exactly as `D` would, with the same
//! effects, and never raises an error. Anything else it declines, charging
//! and changing nothing: a coordinate that is not an integer, a value that
//! is not a string, a value longer than [`MAX_FAST_VALUE_BYTES`], a write a
//! cap or limit refuses, a box bigger than a point read, fuel that would
//! run out. The prelude's wrapper then tail-calls `D`, which answers or
//! raises the error with its message, so every error has one source and
//! `F` only ever shortens the way to an answer.
//!
//! Why the unsafe code is sound: Lua raises errors with `longjmp`, which
//! must not cross a Rust frame with a destructor still to run. `F` does all
//! its Rust work in [`answer`], which returns plain data, and only then
//! pushes results; the only push that can raise (a memory error from
//! `lua_pushlstring`) runs with nothing left to drop. A panic in `answer`
//! is caught and becomes a decline rather than unwinding through Lua's C
//! frames: `D` then meets the same case and the same panic, which mlua
//! carries out of the Lua call and which stops the daemon like any panic
//! on the writer (a write `answer` made before panicking may be made twice
//! on that way out; nothing commits).
//!
//! The module also makes the VM's runner ([`runner_function`]), the C
//! function every run's program is called through, which starts the fuel
//! hook's instruction count over first.
//!
//! This is the server's one exception to the workspace's `unsafe_code`
//! denial (docs/ARCHITECTURE.md lists every module allowed it): the C API
//! has no safe wrapper that is not mlua's callback path itself.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;

use cube_protocol::{CellBox, Coord};
use mlua::{Function, Lua, ffi};

use super::{
    Number, OP_COUNT, OP_DEL, OP_GET, OP_INCR, OP_NUM, OP_PUT, POINT_READ_VOLUME, REGION_CELL_FUEL,
    RELATIVE, RunContext, RunSlot, RunState, parse_number,
};
use crate::programs::sandbox::try_charge;

/// Longest value `F` returns; it is copied out of the store before it is
/// pushed, so that nothing borrowed is alive if the push raises.
const MAX_FAST_VALUE_BYTES: usize = 64;

/// What `F` answers: `Declined` returns no values (the wrapper's `ok` is
/// nil and it calls `D`); the others return `true` and the value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Declined,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Bytes([u8; MAX_FAST_VALUE_BYTES], usize),
}

impl Answer {
    fn number(n: Number) -> Answer {
        match n {
            Number::Int(i) => Answer::Int(i),
            Number::Float(f) => Answer::Float(f),
        }
    }

    fn bytes(value: &[u8]) -> Answer {
        if value.len() > MAX_FAST_VALUE_BYTES {
            return Answer::Declined;
        }
        let mut buf = [0u8; MAX_FAST_VALUE_BYTES];
        buf[..value.len()].copy_from_slice(value);
        Answer::Bytes(buf, value.len())
    }
}

/// A call's arguments after the op, as read off the stack.
struct Call<'s> {
    op: i64,
    /// Each of the six argument slots, when it holds an integer.
    ints: [Option<i64>; 6],
    /// The fourth argument (a value, or an increment): a string's bytes,
    /// and whether it is nil or absent.
    fourth_text: Option<&'s [u8]>,
    fourth_nil: bool,
}

/// Makes `F` for a VM whose dispatcher serves `slot`. The closure holds
/// the slot's address; the slot lives as long as the Lua state, because
/// the dispatcher (`D`, held by the prelude) holds an `Rc` of it.
pub(crate) fn fast_function(lua: &Lua, slot: &RunSlot) -> mlua::Result<Function> {
    let address = Rc::as_ptr(slot).cast::<c_void>().cast_mut();
    // SAFETY: `exec_raw` runs this in a protected call with room on the
    // stack; it pushes one value, a C closure over a light userdata.
    unsafe {
        lua.exec_raw((), |state| {
            ffi::lua_pushlightuserdata(state, address);
            ffi::lua_pushcclosure(state, fast_call, 1);
        })
    }
}

/// Makes the VM's runner: `runner(program, env, args...)` starts the
/// instruction count over and calls `program(env, args...)`, returning
/// what it returns. Every run is called through it, so the fuel hook fires
/// after the same number of instructions into every run, wherever the
/// runs before it (in this VM, or in another) left the count; otherwise a
/// run near its fuel budget passed or failed by its VM's history.
pub(crate) fn runner_function(lua: &Lua) -> mlua::Result<Function> {
    // SAFETY: `exec_raw` runs this in a protected call with room on the
    // stack; it pushes one value, a C function.
    unsafe {
        lua.exec_raw((), |state| {
            ffi::lua_pushcfunction(state, run_program);
        })
    }
}

unsafe extern "C-unwind" fn run_program(state: *mut ffi::lua_State) -> c_int {
    // SAFETY: this frame holds nothing with a destructor, so an error the
    // program raises (a longjmp to the caller's protected call) unwinds
    // over plain data; setting the hook raises nothing.
    unsafe {
        let hook = ffi::lua_gethook(state);
        let mask = ffi::lua_gethookmask(state);
        let count = ffi::lua_gethookcount(state);
        ffi::lua_sethook(state, hook, mask, count);
        let top = ffi::lua_gettop(state);
        if top < 1 {
            return 0;
        }
        ffi::lua_callk(state, top - 1, ffi::LUA_MULTRET, 0, None);
        ffi::lua_gettop(state)
    }
}

unsafe extern "C-unwind" fn fast_call(state: *mut ffi::lua_State) -> c_int {
    // SAFETY: upvalue 1 is the address `fast_function` stored, of a
    // RefCell the Lua state keeps alive (see there).
    let slot = unsafe {
        &*ffi::lua_touserdata(state, ffi::lua_upvalueindex(1))
            .cast::<RefCell<RunState>>()
            .cast_const()
    };
    // SAFETY: reading arguments raises nothing; `call` borrows strings
    // that stay on the stack for the length of the call.
    let answer = match unsafe { read_call(state) } {
        Some(call) => {
            catch_unwind(AssertUnwindSafe(|| answer(slot, &call))).unwrap_or(Answer::Declined)
        }
        None => Answer::Declined,
    };
    // SAFETY: from here only plain data is alive in this frame, so a
    // memory error raised by a push unwinds over nothing to drop; a C
    // function has LUA_MINSTACK (20) free slots, and this pushes two.
    unsafe { push(state, answer) }
}

/// The call's arguments, or `None` when the op is not an integer or there
/// are more arguments than any op takes.
///
/// # Safety
/// `state` is the state of a C function call in progress.
unsafe fn read_call<'s>(state: *mut ffi::lua_State) -> Option<Call<'s>> {
    unsafe {
        let top = ffi::lua_gettop(state);
        if !(1..=7).contains(&top) || ffi::lua_isinteger(state, 1) == 0 {
            return None;
        }
        let op = ffi::lua_tointegerx(state, 1, std::ptr::null_mut());
        let mut ints = [None; 6];
        for (slot, index) in ints.iter_mut().zip(2..) {
            if index <= top && ffi::lua_isinteger(state, index) != 0 {
                *slot = Some(ffi::lua_tointegerx(state, index, std::ptr::null_mut()));
            }
        }
        let fourth = 5;
        let fourth_type = if fourth <= top {
            ffi::lua_type(state, fourth)
        } else {
            ffi::LUA_TNONE
        };
        let fourth_text = if fourth_type == ffi::LUA_TSTRING {
            let mut len = 0usize;
            // A string (not a number) converts nothing and raises nothing.
            let text = ffi::lua_tolstring(state, fourth, &mut len);
            (!text.is_null()).then(|| std::slice::from_raw_parts(text.cast::<u8>(), len))
        } else {
            None
        };
        Some(Call {
            op,
            ints,
            fourth_text,
            fourth_nil: matches!(fourth_type, ffi::LUA_TNIL | ffi::LUA_TNONE),
        })
    }
}

/// # Safety
/// `state` is the state of a C function call in progress.
unsafe fn push(state: *mut ffi::lua_State, answer: Answer) -> c_int {
    unsafe {
        if answer == Answer::Declined {
            return 0;
        }
        ffi::lua_pushboolean(state, 1);
        match answer {
            Answer::Declined | Answer::Nil => ffi::lua_pushnil(state),
            Answer::Bool(b) => ffi::lua_pushboolean(state, c_int::from(b)),
            Answer::Int(i) => ffi::lua_pushinteger(state, i),
            Answer::Float(f) => ffi::lua_pushnumber(state, f),
            Answer::Bytes(buf, len) => {
                ffi::lua_pushlstring(state, buf.as_ptr().cast::<c_char>(), len);
            }
        }
        2
    }
}

/// What `D` would answer to `call`, when that is certain and raises no
/// error; its effects (writes, fuel) are `D`'s.
fn answer(slot: &RefCell<RunState>, call: &Call<'_>) -> Answer {
    #[cfg(test)]
    if tests::FAST_OFF.load(std::sync::atomic::Ordering::Relaxed) {
        return Answer::Declined;
    }
    let answer = answer_run(slot, call);
    #[cfg(test)]
    if answer != Answer::Declined {
        tests::ANSWERED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    answer
}

fn answer_run(slot: &RefCell<RunState>, call: &Call<'_>) -> Answer {
    let Ok(mut state) = slot.try_borrow_mut() else {
        return Answer::Declined;
    };
    let Some(mut context) = RunContext::of(&mut state) else {
        return Answer::Declined;
    };
    let relative = call.op & RELATIVE != 0;
    let [a, b, c, d, e, f] = call.ints;
    let Some(at) = context.fast_coord([a, b, c], relative) else {
        return Answer::Declined;
    };
    match call.op & !RELATIVE {
        OP_GET => context.with_value(at, |value| match value {
            Some(value) => Answer::bytes(value),
            None => Answer::Nil,
        }),
        OP_PUT => match call.fourth_text {
            Some(text) if text.len() <= context.max_value_bytes => {
                match context.write_within_caps(at, Some(text.to_vec())) {
                    Ok(_) => Answer::Nil,
                    Err(_) => Answer::Declined,
                }
            }
            _ => Answer::Declined,
        },
        OP_DEL => match context.write_within_caps(at, None) {
            Ok(existed) => Answer::Bool(existed),
            Err(_) => Answer::Declined,
        },
        OP_NUM => context.with_value(at, |value| match value {
            None => Answer::Nil,
            Some(bytes) => parse_number(bytes).map_or(Answer::Declined, Answer::number),
        }),
        OP_INCR => incr(&mut context, at, d, call.fourth_nil),
        OP_COUNT => match context.fast_coord([d, e, f], relative) {
            Some(hi) => count(&context, at, hi),
            None => Answer::Declined,
        },
        _ => Answer::Declined,
    }
}

/// `incr(at, delta)`: adds `delta` (an integer; nil or absent: 1) to the
/// number at `at` (none: 0) and writes the sum back.
#[inline]
fn incr(context: &mut RunContext<'_>, at: Coord, delta: Option<i64>, delta_nil: bool) -> Answer {
    let delta = match (delta, delta_nil) {
        (Some(i), _) => Number::Int(i),
        (None, true) => Number::Int(1),
        (None, false) => return Answer::Declined,
    };
    let current = context.with_value(at, |value| match value {
        None => Some(Number::Int(0)),
        Some(bytes) => parse_number(bytes),
    });
    let Some(next) = current.and_then(|current| current.add(delta)) else {
        return Answer::Declined;
    };
    match context.write_within_caps(at, Some(next.to_text().into_bytes())) {
        Ok(_) => Answer::number(next),
        Err(_) => Answer::Declined,
    }
}

/// `count(lo, hi)` over a box small enough to read point by point, its
/// fuel charged first.
#[inline]
fn count(context: &RunContext<'_>, lo: Coord, hi: Coord) -> Answer {
    let Ok(region) = CellBox::new(lo, hi) else {
        return Answer::Declined;
    };
    let volume = region.volume();
    if volume > POINT_READ_VOLUME || !try_charge(volume as u64 * REGION_CELL_FUEL) {
        return Answer::Declined;
    }
    let mut count = 0i64;
    let counted: Result<(), std::convert::Infallible> = context.visit_points(&region, |_, _| {
        count += 1;
        Ok(())
    });
    match counted {
        Ok(()) => Answer::Int(count),
    }
}

impl RunContext<'_> {
    /// [`RunContext::coord`] for integer arguments, without the error.
    fn fast_coord(&self, values: [Option<i64>; 3], relative: bool) -> Option<Coord> {
        let origin = if relative {
            [self.here.x, self.here.y, self.here.z]
        } else {
            [0, 0, 0]
        };
        let mut out = [0i32; 3];
        for (axis, (value, origin)) in out.iter_mut().zip(values.into_iter().zip(origin)) {
            *axis = i32::try_from(i64::from(origin).checked_add(value?)?).ok()?;
        }
        Some(Coord::new(out[0], out[1], out[2]))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    use cube_protocol::ProgramValue;

    use crate::programs::harness::{HarnessLimits, HarnessOutcome, ProgramHarness};

    /// Makes `F` decline everything, so that `D` answers every call.
    /// Only this module's test sets it; other tests running meanwhile
    /// just take `D`'s way, with the same results.
    pub(super) static FAST_OFF: AtomicBool = AtomicBool::new(false);
    /// Calls `F` answered.
    pub(super) static ANSWERED: AtomicU64 = AtomicU64::new(0);
    /// This module's tests, one at a time (one of them sets `FAST_OFF`).
    static SERIAL: Mutex<()> = Mutex::new(());

    /// Every kind of call `F` answers or declines, each under `pcall`, on
    /// the harness's cells (integers, a float, text, " 7", a value at the
    /// size limit, the largest integer); the results in order.
    const CALLS: &str = r##"
local out = {}
local function try(name, f, ...)
  local ok, a = pcall(f, ...)
  local shown = tostring(a)
  if #shown > 200 then shown = "#" .. #shown end
  out[#out + 1] = name .. "=" .. tostring(ok) .. ":" .. shown .. ":" .. tostring(math.type(a))
end
try("get", cube.get, 1, 0, 0)
try("rget", cube.rget, -1, 0, 0)
try("get_float_coord", cube.get, 1.0, 0, 0)
try("get_string_coord", cube.get, "1", 0, 0)
try("get_missing_arg", cube.get, 1, 0)
try("get_big", cube.get, 1, 1, 1)
try("get_empty", cube.get, 5, 5, 5)
try("get_range", cube.get, 2147483648, 0, 0)
try("rget_overflow", cube.rget, math.maxinteger, 0, 0)
try("num_int", cube.num, 1, 0, 0)
try("num_float", cube.rnum, -1, 0, 0)
try("num_text", cube.num, 0, -1, 0)
try("num_space", cube.rnum, 0, 0, 1)
try("num_empty", cube.num, 5, 5, 5)
try("incr", cube.incr, 1, 0, 0)
try("rincr_by", cube.rincr, 1, 0, 0, 5)
try("incr_float", cube.incr, -1, 0, 0)
try("incr_by_float", cube.incr, 1, 0, 0, 0.5)
try("incr_by_text", cube.incr, 1, 0, 0, "2")
try("incr_overflow", cube.incr, 2, 0, 0)
try("incr_text", cube.incr, 0, -1, 0)
try("incr_new", cube.incr, 9, 9, 9)
try("put", cube.put, 3, 3, 3, "v")
try("put_number", cube.put, 3, 3, 4, 12)
try("put_nil", cube.put, 3, 3, 5, nil)
try("put_table", cube.rput, 3, 3, 5, {})
try("put_too_big", cube.put, 3, 3, 6, string.rep("x", 4097))
try("put_at_limit", cube.put, 3, 3, 7, string.rep("y", 4096))
try("after_put", cube.get, 3, 3, 3)
try("after_put_number", cube.get, 3, 3, 4)
try("after_put_at_limit", cube.count, 3, 3, 7, 3, 3, 7)
try("del", cube.del, 3, 3, 3)
try("del_again", cube.del, 3, 3, 3)
try("rdel", cube.rdel, 0, 1, 0)
try("del_float", cube.del, 3.5, 3, 3)
try("count", cube.count, -1, -1, -1, 1, 1, 1)
try("rcount", cube.rcount, 0, 0, 0, 2, 2, 2)
try("count_inverted", cube.count, 1, 0, 0, 0, 0, 0)
try("count_big", cube.count, -2, -2, -2, 2, 2, 2)
try("count_missing_arg", cube.count, 0, 0, 0, 1, 1)
return out
"##;

    fn results(fast: bool) -> (Vec<ProgramValue>, u64, u64) {
        FAST_OFF.store(!fast, Relaxed);
        let answered_before = ANSWERED.load(Relaxed);
        let mut harness = ProgramHarness::new(HarnessLimits::SMALL).unwrap();
        let outcome = harness.run(CALLS.as_bytes(), &[]).unwrap();
        FAST_OFF.store(false, Relaxed);
        let answered = ANSWERED.load(Relaxed) - answered_before;
        let HarnessOutcome::Ran(run) = outcome else {
            panic!("refused: {outcome:?}")
        };
        let Ok(ProgramValue::Table(entries)) = run.result else {
            panic!("{:?}", run.result)
        };
        let values = entries.into_iter().map(|(_, v)| v).collect();
        (values, run.cells_after, answered)
    }

    /// The one push of `F` that can raise: a value copied into a new Lua
    /// string when the run's memory is spent. The error unwinds over
    /// `fast_call`; the run fails as out of memory, and the next run finds
    /// the VM and its run slot as they should be.
    #[test]
    fn running_out_of_memory_inside_the_fast_path_leaves_the_vm_sound() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let limits = HarnessLimits {
            // Enough fuel that memory runs out first.
            fuel: 10_000_000,
            time: std::time::Duration::from_secs(5),
            ..HarnessLimits::SMALL
        };
        let mut harness = ProgramHarness::new(limits).unwrap();
        // The table is sized first, so that the loop's only allocations
        // are the strings F pushes (60 bytes: a long string, never shared).
        let hog = b"cube.put(5, 5, 5, string.rep('z', 60))\n\
            local kept = {}\n\
            for i = 1, 20000 do kept[i] = false end\n\
            for i = 1, 20000 do kept[i] = cube.get(5, 5, 5) end";
        let answered_before = ANSWERED.load(Relaxed);
        let HarnessOutcome::Ran(run) = harness.run(hog, &[]).unwrap() else {
            panic!("refused")
        };
        assert!(ANSWERED.load(Relaxed) - answered_before > 1000);
        let Err((outcome, message)) = run.result else {
            panic!("{:?}", run.result)
        };
        assert_eq!(outcome, cube_protocol::RunOutcome::Memory, "{message}");
        let HarnessOutcome::Ran(next) = harness.run(b"return cube.get(1, 0, 0)", &[]).unwrap()
        else {
            panic!("refused")
        };
        assert_eq!(next.result.unwrap(), ProgramValue::Bytes(b"1".to_vec()));
    }

    #[test]
    fn the_fast_path_answers_every_call_as_the_dispatcher_does() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (slow, slow_cells, _) = results(false);
        let (fast, fast_cells, answered) = results(true);
        assert_eq!(slow.len(), 40);
        let text = |v: &ProgramValue| match v {
            ProgramValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        for (slow, fast) in slow.iter().zip(&fast) {
            assert_eq!(text(slow), text(fast));
        }
        assert_eq!(slow_cells, fast_cells);
        // The calls F can answer: plain gets, nums, incrs by integers,
        // string puts within the limit, deletes, small counts.
        assert!(answered >= 20, "F answered {answered} calls");
    }
}
