//! The Lua VM that runs cell programs, and its sandbox and budgets.
//!
//! One VM per thread (mlua's `Lua` is not `Send`): runs happen on the
//! writer thread, inside `WriteSession::transact`, so they use the
//! writer's VM; connection threads keep a bare VM only to check a `prog`'s
//! syntax. A stored program is compiled once per distinct source and
//! cached.
//!
//! The sandbox, and why each piece is there:
//! - Programs see only a per-run environment whose fallback is a table of
//!   safe globals: `string`, `table`, `math`, `utf8` and the harmless base
//!   functions. (One environment table serves run after run while programs
//!   leave it empty; one a program wrote globals into is replaced before
//!   the next run, so nothing carries over.) No `io`, `os`, `debug`,
//!   `package`, `require`, `load`, `dofile`, `loadfile`, `collectgarbage`,
//!   `print`, `coroutine`.
//! - Library tables are read-only proxies shared by every run, and
//!   `rawset` refuses them, so no program can change what another sees.
//!   The string metatable is protected (`getmetatable("")` is `false`).
//! - `string.dump` is gone and sources load in text mode only: no
//!   bytecode ever enters the VM.
//! - Lua patterns (`match`, `gmatch`, `gsub`, and `find` without `plain`)
//!   are refused: they backtrack inside one C call, where no instruction
//!   budget can interrupt them.
//! - Library calls whose C loops are not paid for by allocation
//!   (`string.rep` of empty strings, `table.move`, `sort`, `concat`,
//!   `unpack`, shifting `insert`/`remove`) are charged fuel by size.
//! - `math.randomseed` is refused: one generator serves every run of
//!   every namespace, so a seed would fix what other programs draw.
//! - `setmetatable` refuses `__gc`, so no finaliser can run outside its
//!   run's budget.
//! - `pcall`/`xpcall` cannot swallow a spent budget: once fuel, time or
//!   memory ran out, every protected call re-raises, and an `xpcall`
//!   message handler is not run for it (it would run inside the count
//!   hook, where hooks are off, unmetered).
//! - cube's Lua (third_party/lua-src/CUBE-PATCH.md) charges the loops that
//!   library calls and VM operations run in C over their inputs, through
//!   the charge function it finds in the registry (`LUA_CUBE_CHARGE`);
//!   refuses to-be-closed values, numeric strings over 200 bytes, and
//!   `%p`; and `tostring` shows no heap address.
//!
//! Budgets: fuel counts VM instructions through a count hook every
//! [`FUEL_BLOCK`] instructions (plus charges), memory is the allocator
//! limit of the whole VM set to "in use now + budget" for the run, and a
//! wall-clock backstop catches programs whose single instructions are
//! heavy (copying megabyte strings), which instruction counting cannot see.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlua::chunk::ChunkMode;
use mlua::debug::Debug;
use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value, VmState};

use super::api::{self, RunSlot};

/// The count hook fires every this many VM instructions: often enough to
/// stop a runaway loop within microseconds, rarely enough to cost about 1 %.
/// Telemetry's instruction count is therefore a multiple of it (plus the
/// charges of library calls), rounded down.
pub(crate) const FUEL_BLOCK: u32 = 1000;

/// Chunk name of a program, so Lua's messages read `prog:LINE: ...`.
const CHUNK_NAME: &str = "prog";

/// Compiled programs kept per VM, by total source bytes; past it the cache
/// is emptied (programs are small and recompiling is microseconds).
const COMPILED_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// ...and by what they hold: the growth of the VM's memory since the cache
/// was last emptied (a compiled function can take ten times its source:
/// 2500 sources of 64 KiB held 1.7 GiB under the source-bytes cap alone).
/// The growth counts garbage too, which only empties the cache sooner.
const COMPILED_CACHE_MEMORY: usize = 64 * 1024 * 1024;

/// Slots of the by-address function cache (log2). Direct-mapped: a
/// program stored anew gets a new source `Arc`, so a map by address kept
/// growing (and rehashing) under clients that re-store programs, while a
/// slot array costs one index and replaces what it displaces.
const ADDRESS_CACHE_BITS: u32 = 13;

/// Memory the syntax-checking VM may hold (mostly garbage of earlier
/// checks) before a check ends with a full collection.
const SYNTAX_VM_GARBAGE_BYTES: usize = 1024 * 1024;

/// Sources this thread's syntax check accepted lately, kept whole (so a
/// hit is exact) when at most this long...
const ACCEPTED_SOURCE_BYTES: usize = 4096;
/// ...and at most this many of them before the set is emptied. Clients
/// often store one program at many cells (a rule per cell); a repeat is
/// then a hash lookup instead of a compile.
const ACCEPTED_SOURCES: usize = 64;

/// The registry key of the charge function that cube's Lua calls from C
/// (`LUA_CUBE_CHARGE` in cube's `lua.h`:
/// third_party/lua-src/patches/03-budget-lua.h.patch).
const LUA_CUBE_CHARGE: &str = "cube.charge";

/// Lua's own message for a failed allocation.
const OUT_OF_MEMORY: &str = "not enough memory";

/// Why a run's budget stopped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spent {
    Fuel,
    Time,
    Memory,
}

/// The current run's budget, shared by the hook, the charge function and
/// the protected-call guard (all on this thread).
struct Budget {
    active: Cell<bool>,
    fuel_limit: Cell<u64>,
    used: Cell<u64>,
    deadline: Cell<Option<Instant>>,
    spent: Cell<Option<Spent>>,
}

thread_local! {
    static BUDGET: Budget = const {
        Budget {
            active: Cell::new(false),
            fuel_limit: Cell::new(0),
            used: Cell::new(0),
            deadline: Cell::new(None),
            spent: Cell::new(None),
        }
    };
    static VM: RefCell<Option<ProgramVm>> = const { RefCell::new(None) };
    static SYNTAX_VM: RefCell<Option<Lua>> = const { RefCell::new(None) };
    static ACCEPTED: RefCell<Option<HashSet<Box<[u8]>>>> = const { RefCell::new(None) };
}

fn spent_message(spent: Spent) -> &'static str {
    match spent {
        Spent::Fuel => "out of fuel: the program ran past its instruction budget (--program-fuel)",
        Spent::Time => {
            "out of time: the program ran past the writer-time backstop (--program-time-ms)"
        }
        Spent::Memory => "out of memory: the program allocated past its budget (--program-memory)",
    }
}

/// Marks the budget spent and returns the error that unwinds the program.
fn exhaust(spent: Spent) -> mlua::Error {
    BUDGET.with(|b| {
        if b.spent.get().is_none() {
            b.spent.set(Some(spent));
        }
    });
    mlua::Error::RuntimeError(spent_message(spent).to_owned())
}

/// Adds `units` of fuel to the current run; an error once it is spent.
pub(crate) fn charge(units: u64) -> mlua::Result<()> {
    BUDGET.with(|b| {
        if !b.active.get() {
            return Ok(());
        }
        let used = b.used.get().saturating_add(units);
        b.used.set(used);
        if let Some(spent) = b.spent.get() {
            return Err(exhaust(spent));
        }
        if used > b.fuel_limit.get() {
            return Err(exhaust(Spent::Fuel));
        }
        Ok(())
    })
}

/// Charges `units` if they fit in the run's fuel and nothing is spent
/// yet; otherwise charges nothing and says `false`, for a caller that then
/// goes the way that raises the error ([`charge`]).
pub(crate) fn try_charge(units: u64) -> bool {
    BUDGET.with(|b| {
        if !b.active.get() {
            return true;
        }
        let used = b.used.get().saturating_add(units);
        if b.spent.get().is_some() || used > b.fuel_limit.get() {
            return false;
        }
        b.used.set(used);
        true
    })
}

/// The count hook: every [`FUEL_BLOCK`] instructions.
fn on_instructions(_lua: &Lua, _debug: &Debug) -> mlua::Result<VmState> {
    charge(u64::from(FUEL_BLOCK))?;
    if late() {
        return Err(exhaust(Spent::Time));
    }
    Ok(VmState::Continue)
}

/// Whether the current run is past its wall-clock backstop.
fn late() -> bool {
    BUDGET.with(|b| {
        b.active.get()
            && b.deadline
                .get()
                .is_some_and(|deadline| Instant::now() > deadline)
    })
}

/// Limits of one run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunBudget {
    pub(crate) fuel: u64,
    pub(crate) memory_bytes: usize,
    pub(crate) time: Duration,
}

/// How a run's Lua part ended.
pub(crate) struct LuaOutcome<R> {
    pub(crate) result: Result<R, Failure>,
    pub(crate) fuel_used: u64,
}

/// A failed run: which budget (if any) stopped it, and the message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) spent: Option<Spent>,
    pub(crate) message: String,
}

/// The writer thread's VM: the sandbox pieces made once, and compiled
/// programs.
pub(crate) struct ProgramVm {
    pub(crate) lua: Lua,
    env_meta: Table,
    /// The per-run environment, reused while runs leave it empty.
    env: Table,
    /// The run the API dispatcher serves (see `api::RunSlot`).
    pub(crate) slot: RunSlot,
    /// The raw `cube` API table (programs see a read-only proxy); its
    /// `x`, `y`, `z` and `ns` are set per run.
    pub(crate) api: Table,
    /// Calls each run's program with its instruction count started over.
    runner: Function,
    compiled: HashMap<Arc<[u8]>, Function>,
    compiled_bytes: usize,
    /// The VM's memory in use when the cache was last emptied.
    cache_base_memory: usize,
    /// The same functions by the address of the store's source `Arc`
    /// (held, so the address stays unique): a run of an unchanged program
    /// finds its function without hashing the source.
    by_source_address: Vec<Option<(Arc<[u8]>, Function)>>,
    pub(crate) compiles: u64,
    /// The namespace and cell the API table was last set for.
    here_ns: Option<cube_protocol::NamespaceName>,
    here: Option<cube_protocol::Coord>,
}

/// The prelude's check after a run: the message of the budget the run
/// spent, if it spent one (a memory error while a budget is active counts
/// as spending the memory budget).
fn budget_check_function(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|_, (ok, error): (bool, Value)| {
        let spent = BUDGET.with(|b| b.spent.get());
        if let Some(spent) = spent {
            return Ok(Some(spent_message(spent)));
        }
        let out_of_memory = !ok
            && match &error {
                Value::String(s) => s.as_bytes().as_ref() == OUT_OF_MEMORY.as_bytes(),
                Value::Error(e) => is_memory_error(e),
                _ => false,
            };
        if out_of_memory && BUDGET.with(|b| b.active.get()) {
            BUDGET.with(|b| b.spent.set(Some(Spent::Memory)));
            return Ok(Some(spent_message(Spent::Memory)));
        }
        Ok(None)
    })
}

/// `charge(units)`: what library calls and VM operations that loop in C
/// pay before their loop.
fn charge_function(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|_, units: f64| {
        // Negative or NaN charges (odd arguments the library call will
        // refuse anyway) cost nothing; huge ones saturate.
        let units = if units.is_finite() && units > 0.0 {
            units.min(u64::MAX as f64) as u64
        } else if units.is_infinite() && units > 0.0 {
            u64::MAX
        } else {
            0
        };
        charge(units)?;
        // A charge from C comes before work of at least a block
        // (CUBE-PATCH.md), so the time backstop is checked there too.
        if late() {
            return Err(exhaust(Spent::Time));
        }
        Ok(())
    })
}

/// The real globals are never a program's environment, but the dangerous
/// functions and libraries are taken away from them anyway.
fn remove_dangerous_globals(lua: &Lua) -> mlua::Result<()> {
    let globals = lua.globals();
    for name in [
        "load",
        "loadstring",
        "dofile",
        "loadfile",
        "require",
        "collectgarbage",
        "print",
        "package",
        "io",
        "os",
        "debug",
        "coroutine",
    ] {
        globals.raw_set(name, Value::Nil)?;
    }
    Ok(())
}

/// What the sandbox prelude builds, once per VM, with the full standard
/// library in scope. It returns the safe base table, the metatable of
/// per-run environments, and the raw API table.
const PRELUDE: &str = include_str!("prelude.lua");

impl ProgramVm {
    fn new() -> mlua::Result<ProgramVm> {
        let lua = Lua::new_with(
            StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8,
            LuaOptions::default(),
        )?;
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(FUEL_BLOCK),
            on_instructions,
        )?;
        let budget_check = budget_check_function(&lua)?;
        let charge_fn = charge_function(&lua)?;
        // Library calls and VM operations that loop over their inputs in C
        // pay here, before the loop, when their charge is past the rest of
        // the count hook's block (third_party/lua-src/CUBE-PATCH.md,
        // "Paying for work inside one call").
        lua.set_named_registry_value(LUA_CUBE_CHARGE, charge_fn.clone())?;
        let slot = RunSlot::default();
        let dispatcher = api::dispatcher(&lua, Rc::clone(&slot))?;
        let fast = api::fast_function(&lua, &slot)?;
        let runner = api::runner_function(&lua)?;
        let (base, env_meta, api): (Table, Table, Table) = lua
            .load(PRELUDE)
            .set_name("=cube")
            .set_mode(ChunkMode::Text)
            .call((budget_check, charge_fn, dispatcher, fast))?;
        let env = lua.create_table()?;
        env.set_metatable(Some(env_meta.clone()))?;
        remove_dangerous_globals(&lua)?;
        drop(base);
        let cache_base_memory = lua.used_memory();
        Ok(ProgramVm {
            lua,
            env_meta,
            env,
            slot,
            api,
            runner,
            compiled: HashMap::new(),
            compiled_bytes: 0,
            cache_base_memory,
            by_source_address: vec![None; 1 << ADDRESS_CACHE_BITS],
            compiles: 0,
            here_ns: None,
            here: None,
        })
    }

    /// The compiled function of `source` (from the cache, or compiled now,
    /// inside the current run's budget).
    fn function(&mut self, source: &Arc<[u8]>) -> Result<Function, Failure> {
        let slot = address_slot(source);
        if let Some(Some((held, function))) = self.by_source_address.get(slot)
            && Arc::ptr_eq(held, source)
        {
            return Ok(function.clone());
        }
        if let Some(function) = self.compiled.get(source.as_ref()) {
            let function = function.clone();
            if let Some(entry) = self.by_source_address.get_mut(slot) {
                *entry = Some((Arc::clone(source), function.clone()));
            }
            return Ok(function);
        }
        // The program becomes the body of a function taking its
        // environment and the run's arguments, on the same first line so
        // line numbers match the source. The source compiled on its own
        // when it was stored, so the wrapper cannot change its meaning.
        let mut wrapped = Vec::with_capacity(source.len() + 40);
        wrapped.extend_from_slice(b"return function(_ENV, ...) ");
        wrapped.extend_from_slice(source);
        wrapped.extend_from_slice(b"\nend");
        let empty_env = self.lua.create_table().map_err(failure)?;
        let function: Function = self
            .lua
            .load(&wrapped[..])
            .set_name(format!("={CHUNK_NAME}"))
            .set_mode(ChunkMode::Text)
            .set_environment(empty_env)
            .eval()
            .map_err(failure)?;
        self.compiles += 1;
        let grown = self
            .lua
            .used_memory()
            .saturating_sub(self.cache_base_memory);
        if self.compiled_bytes + source.len() > COMPILED_CACHE_BYTES
            || grown > COMPILED_CACHE_MEMORY
        {
            self.clear_cache();
        }
        self.compiled_bytes += source.len();
        self.compiled.insert(Arc::clone(source), function.clone());
        if let Some(entry) = self.by_source_address.get_mut(slot) {
            *entry = Some((Arc::clone(source), function.clone()));
        }
        Ok(function)
    }

    /// Forgets every compiled program: both maps, or the by-address slots
    /// would keep the functions alive.
    fn clear_cache(&mut self) {
        self.compiled.clear();
        self.by_source_address.fill(None);
        self.compiled_bytes = 0;
        self.cache_base_memory = self.lua.used_memory();
    }

    /// Points the API table at the run's cell, setting only what changed
    /// since the last run (programs cannot modify the table): most runs
    /// stay in one namespace, and each table write costs a call into Lua.
    pub(crate) fn set_here(
        &mut self,
        ns: &cube_protocol::NamespaceName,
        here: cube_protocol::Coord,
    ) -> mlua::Result<()> {
        if self.here_ns.as_ref() != Some(ns) {
            self.here_ns = None;
            api::set_here_ns(&self.api, ns)?;
            self.here_ns = Some(ns.clone());
        }
        if self.here != Some(here) {
            let before = self.here.take();
            api::set_here(&self.api, before, here)?;
            self.here = Some(here);
        }
        Ok(())
    }

    pub(crate) fn cached_programs(&self) -> usize {
        self.compiled.len()
    }

    /// Runs `source` with `args` under `budget`, its wall-clock backstop
    /// counted from `started`. `call` gets the VM's runner (see
    /// `api::runner_function`) and its arguments (the compiled program, the
    /// per-run environment, then `args`), makes the call and turns the
    /// result into `R`, all still inside the budget.
    pub(crate) fn run<R>(
        &mut self,
        source: &Arc<[u8]>,
        args: &[Vec<u8>],
        budget: RunBudget,
        started: Instant,
        call: impl FnOnce(&Function, (Function, &Table, MultiValue)) -> mlua::Result<R>,
    ) -> LuaOutcome<R> {
        // Compiled (or found compiled) before the run's budgets start: the
        // memory and instructions of a compile are the source's, bounded by
        // its size, and counting them against the first run of each VM
        // would make a run near its budget fail or not by whether its VM
        // (the writer's, or a step thread's new one) had compiled it before.
        let function = self.function(source);
        let used_before = self.lua.used_memory();
        // The arguments are made before the limit is set, so that their
        // strings skip mlua's protected (pcall) allocation path; they
        // still count against the budget, which starts from
        // `used_before`: arguments past it fail the program's first
        // allocation, as a memory error.
        let values = arg_values(&self.lua, args).map_err(failure);
        let _ = self
            .lua
            .set_memory_limit(used_before.saturating_add(budget.memory_bytes));
        BUDGET.with(|b| {
            b.active.set(true);
            b.fuel_limit.set(budget.fuel);
            b.used.set(0);
            b.deadline.set(Some(started + budget.time));
            b.spent.set(None);
        });
        let result = values.and_then(|values| {
            let function = function?;
            // A program that left globals gets them dropped with its
            // environment, made anew (inside the budget, as it always was)
            // for the next run; nothing else can hold the table.
            if !self.env.is_empty() {
                let env = self.lua.create_table().map_err(failure)?;
                env.set_metatable(Some(self.env_meta.clone()))
                    .map_err(failure)?;
                self.env = env;
            }
            call(&self.runner, (function, &self.env, values)).map_err(failure)
        });
        let (fuel_used, spent) = BUDGET.with(|b| {
            b.active.set(false);
            b.deadline.set(None);
            (b.used.get(), b.spent.take())
        });
        let _ = self.lua.set_memory_limit(0);
        let result = match (result, spent) {
            (_, Some(spent)) => Err(Failure {
                spent: Some(spent),
                message: spent_message(spent).to_owned(),
            }),
            (Err(mut failure), None) => {
                if failure.spent.is_none() && failure.message.contains(OUT_OF_MEMORY) {
                    failure.spent = Some(Spent::Memory);
                    failure.message = spent_message(Spent::Memory).to_owned();
                }
                Err(failure)
            }
            (Ok(value), None) => Ok(value),
        };
        LuaOutcome { result, fuel_used }
    }
}

/// The by-address cache slot of a source: its address, mixed (Fibonacci
/// hashing) so that allocations' common low and high bits spread out.
fn address_slot(source: &Arc<[u8]>) -> usize {
    let address = Arc::as_ptr(source).cast::<u8>() as usize as u64;
    (address.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - ADDRESS_CACHE_BITS)) as usize
}

/// Runs `f` with this thread's program VM, creating it on first use.
pub(crate) fn with_vm<R>(f: impl FnOnce(&mut ProgramVm) -> R) -> Result<R, String> {
    VM.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(ProgramVm::new().map_err(|e| format!("cannot start the Lua VM: {e}"))?);
        }
        match slot.as_mut() {
            Some(vm) => Ok(f(vm)),
            None => Err("the Lua VM is not available".to_owned()),
        }
    })
}

/// A syntax error: the line (when Lua names one) and Lua's reason.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) line: Option<u32>,
    pub(crate) message: String,
}

/// Compiles `source` without running it, in a bare VM of this thread
/// (or finds it among the sources this thread accepted lately: whether a
/// source compiles depends on its bytes alone).
pub(crate) fn check_syntax(source: &[u8]) -> Result<(), SyntaxError> {
    let small = source.len() <= ACCEPTED_SOURCE_BYTES;
    if small
        && ACCEPTED.with(|set| {
            set.borrow()
                .as_ref()
                .is_some_and(|set| set.contains(source))
        })
    {
        return Ok(());
    }
    compile_check(source)?;
    if small {
        ACCEPTED.with(|set| {
            let mut set = set.borrow_mut();
            let set = set.get_or_insert_with(HashSet::new);
            if set.len() >= ACCEPTED_SOURCES {
                set.clear();
            }
            set.insert(Box::from(source));
        });
    }
    Ok(())
}

fn compile_check(source: &[u8]) -> Result<(), SyntaxError> {
    SYNTAX_VM.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            let lua =
                Lua::new_with(StdLib::NONE, LuaOptions::default()).map_err(|e| SyntaxError {
                    line: None,
                    message: format!("cannot start the Lua VM: {e}"),
                })?;
            // A compile allocates in proportion to the source; a bound
            // keeps a hostile 64 KiB source from costing more.
            let _ = lua.set_memory_limit(64 * 1024 * 1024);
            *slot = Some(lua);
        }
        let Some(lua) = slot.as_ref() else {
            return Ok(());
        };
        let outcome = lua
            .load(source)
            .set_name(format!("={CHUNK_NAME}"))
            .set_mode(ChunkMode::Text)
            .into_function();
        // A full collection after every check cost more than the compile
        // itself; collect only once what compiles left behind adds up.
        if lua.used_memory() > SYNTAX_VM_GARBAGE_BYTES {
            lua.gc_collect().ok();
        }
        match outcome {
            Ok(_) => Ok(()),
            Err(e) => {
                let text = error_text(&e);
                let (line, message) = split_position(&text);
                Err(SyntaxError { line, message })
            }
        }
    })
}

fn is_memory_error(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory_error(cause),
        mlua::Error::WithContext { cause, .. } => is_memory_error(cause),
        _ => false,
    }
}

fn failure(e: mlua::Error) -> Failure {
    let spent = is_memory_error(&e).then_some(Spent::Memory);
    Failure {
        spent,
        message: error_text(&e),
    }
}

/// The message of an error without mlua's decorations or a traceback.
pub(crate) fn error_text(e: &mlua::Error) -> String {
    let text = match e {
        mlua::Error::RuntimeError(message) | mlua::Error::MemoryError(message) => message.clone(),
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::CallbackError { cause, .. } => return error_text(cause),
        mlua::Error::WithContext { cause, .. } => return error_text(cause),
        other => other.to_string(),
    };
    let text = match text.find("\nstack traceback:") {
        Some(at) => text[..at].to_owned(),
        None => text,
    };
    text.trim_end().to_owned()
}

/// `prog:12: reason` becomes `(Some(12), "reason")`; anything else is
/// kept whole.
pub(crate) fn split_position(text: &str) -> (Option<u32>, String) {
    let prefix = format!("{CHUNK_NAME}:");
    if let Some(rest) = text.strip_prefix(&prefix)
        && let Some((line, reason)) = rest.split_once(':')
        && let Ok(line) = line.parse::<u32>()
    {
        return (Some(line), reason.trim_start().to_owned());
    }
    (None, text.to_owned())
}

/// Turns `prog:12: reason` into `line 12: reason` for people.
pub(crate) fn readable(text: &str) -> String {
    match split_position(text) {
        (Some(line), reason) => format!("line {line}: {reason}"),
        (None, text) => text,
    }
}

/// A run's arguments as Lua strings.
fn arg_values(lua: &Lua, args: &[Vec<u8>]) -> mlua::Result<MultiValue> {
    let mut values = MultiValue::with_capacity(args.len());
    for arg in args {
        values.push_back(Value::String(lua.create_string(arg)?));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_name_their_line() {
        assert_eq!(check_syntax(b"local x = 1\nreturn x"), Ok(()));
        let err = check_syntax(b"local x = 1\nlocal = 2\n").unwrap_err();
        assert_eq!(err.line, Some(2), "{err:?}");
        assert!(err.message.contains("near"), "{err:?}");
        // A binary chunk is refused, never loaded.
        let err = check_syntax(b"\x1bLua\x54\x00").unwrap_err();
        assert!(err.message.contains("binary"), "{err:?}");
    }

    /// Budgets no test program here comes near but the one it sets.
    fn roomy_budget() -> RunBudget {
        RunBudget {
            fuel: 1_000_000,
            memory_bytes: 512 * 1024 * 1024,
            time: Duration::from_secs(60),
        }
    }

    /// Distinct large programs, each run once, keep only a bounded amount
    /// of compiled code alive (both caches are emptied together, by source
    /// bytes and by the memory the functions hold).
    #[test]
    fn compiled_programs_are_bounded_by_what_they_hold() {
        let mut vm = ProgramVm::new().unwrap();
        let budget = roomy_budget();
        // About 64 KiB of source: many small functions compile to far more
        // than their text.
        let body: String = (0..2200)
            .map(|i| format!("t[{i}] = function() end "))
            .collect();
        let mut held = Vec::new();
        for n in 0..600 {
            let source: Arc<[u8]> =
                Arc::from(format!("-- {n}\nlocal t = {{}} {body} return {n}").into_bytes());
            let outcome = vm.run(&source, &[], budget, Instant::now(), |_, _| Ok(()));
            assert!(outcome.result.is_ok(), "{:?}", outcome.result.err());
            // The store keeps its sources alive, as these do.
            held.push(source);
        }
        vm.lua.gc_collect().unwrap();
        vm.lua.gc_collect().unwrap();
        let used = vm.lua.used_memory();
        assert!(
            used < COMPILED_CACHE_MEMORY + 32 * 1024 * 1024,
            "{} MiB still held by {} cached programs",
            used >> 20,
            vm.cached_programs()
        );
    }

    /// The count hook's blocks count every VM instruction once, through
    /// the patched `vmfetch` (third_party/lua-src/CUBE-PATCH.md): 10 000
    /// more turns of an empty loop are exactly 10 more blocks, and a loop
    /// without end stops within one block past its budget.
    #[test]
    fn fuel_counts_every_instruction_once() {
        let mut vm = ProgramVm::new().unwrap();
        let budget = roomy_budget();
        let mut used = |source: &str, budget: RunBudget| {
            let source: Arc<[u8]> = Arc::from(source.as_bytes());
            let outcome = vm.run(&source, &[], budget, Instant::now(), |runner, args| {
                runner.call::<()>(args)
            });
            (outcome.result.is_ok(), outcome.fuel_used)
        };
        let (ok_short, short) = used("for i = 1, 10500 do end", budget);
        let (ok_long, long) = used("for i = 1, 20500 do end", budget);
        assert!(ok_short && ok_long);
        assert_eq!(long - short, 10_000);
        assert!((10_000..=11_000).contains(&short), "{short}");
        let (ok, spent) = used(
            "while true do end",
            RunBudget {
                fuel: 5_000,
                ..budget
            },
        );
        assert!(!ok);
        assert!((5_000..=6_000).contains(&spent), "{spent}");
    }

    #[test]
    fn positions_are_split_and_made_readable() {
        assert_eq!(
            split_position("prog:7: attempt to call a nil value"),
            (Some(7), "attempt to call a nil value".to_owned())
        );
        assert_eq!(readable("prog:3: boom"), "line 3: boom");
        assert_eq!(readable("no position"), "no position");
    }
}
