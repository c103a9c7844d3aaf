//! Guards cell-program execution against any source: random bytes, Lua token soup, generated programs and mutations of hostile ones are stored and run through the same code as `prog` and `run` (`cube_server::ProgramHarness`, small budgets), and none may panic, hang, escape its budgets, return what the protocol cannot carry, or apply the writes of a failed run.
//!
//! A property test in the manner of proptest, without the dependency:
//! seeded generators, a fixed case budget and a wall-clock cap so CI time
//! stays bounded. `CUBE_GARBAGE_SEED=S` replays a run, and
//! `CUBE_GARBAGE_CASES=N` runs more cases (no time cap then); a failure
//! prints the seed, the case and the source. The same harness and check
//! back the `program_run` fuzz target (`make fuzz`).
#![allow(clippy::unwrap_used)]

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use cube_server::{HarnessLimits, HarnessOutcome, ProgramHarness};

/// Cases in CI, and the wall-clock cap on them (after the fixed hostile
/// programs, which always run).
const DEFAULT_CASES: u64 = 10_000;
const DEFAULT_WALL: Duration = Duration::from_secs(4);
/// Runs on one harness before a fresh one replaces it.
const RUNS_PER_HARNESS: u64 = 500;

/// Programs that try to escape a budget, break the result conversion or
/// reach odd corners of the API; each runs as is, and as the base of
/// mutations.
const HOSTILE: &[&str] = &[
    "return cube.rincr(0, 0, 0, tonumber((...)) or 1)",
    "while true do end",
    "::a:: goto a",
    "local t = {} while true do t[#t + 1] = string.rep('x', 1000) end",
    "local s = 'x' while true do s = s .. s end",
    "return string.rep('x', 1e9)",
    "return string.rep('', 1e12)",
    "return string.rep('x', 100, string.rep(',', 1e6))",
    "for i = 1, 1e9 do cube.put(i, 0, 0, i) end",
    "for i = 1, 20000 do cube.put(i, 7, 7, 'v') end return 1",
    "local t = {} for i = 1, 5000 do t[i] = i end return t",
    "return {{}}",
    "return function() end",
    "return {[1.5] = 1}",
    "return {x = {}}",
    "return 0/0, 1",
    "return math.huge",
    "return math.mininteger // -1, math.mininteger % -1",
    "pcall(function() while true do end end) return 1",
    "local ok = pcall(string.rep, 'x', 1e9) return ok",
    "xpcall(function() local s = 'x' while true do s = s .. s end end, function() return 1 end) return 2",
    "setmetatable({}, {__gc = function() while true do end end}) return 1",
    "error(setmetatable({}, {__tostring = function() while true do end end}))",
    "error(setmetatable({}, {__tostring = function() return string.rep('e', 1e8) end}))",
    "error(string.rep('e', 100000))",
    "error()",
    "error(nil)",
    "error({})",
    "return setmetatable({}, {__pairs = function() while true do end end})",
    "return setmetatable({1, 2}, {__index = function() while true do end end})",
    "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x",
    "local function f(n) return f(n + 1) + 1 end return f(1)",
    "local function f(n) return f(n + 1) end return f(1)",
    "return string.find(string.rep('a', 30), '(a*)*b')",
    "return string.find(string.rep('a', 30), 'a', 1, true)",
    "return string.gsub('abc', 'b', 'x')",
    "return string.format('%99999d', 1)",
    "return string.format(string.rep('%d', 1000), 1)",
    "return utf8.char(0x7FFFFFFF), utf8.len('\\xff')",
    "return table.concat(setmetatable({}, {__index = function() return 'x' end}), ',', 1, 1e8)",
    "return table.unpack({}, 1, 1e7)",
    "local t = {} table.move({1, 2, 3}, 1, 1e9, 2, t) return #t",
    "local t = {} for i = 1, 1000 do t[i] = -i end table.sort(t, function(a, b) return true end) return t[1]",
    "table.insert({}, 1e9, 1)",
    "return cube.num(0, -1, 0)",
    "return cube.num(0, 0, 1)",
    "return cube.incr(2, 0, 0)",
    "return cube.incr(1, 0, 0, 0.5), cube.incr(1, 0, 0, math.maxinteger)",
    "return cube.sum(-1e9, -1e9, -1e9, 1e9, 1e9, 1e9)",
    "return cube.count(math.mininteger, 0, 0, math.maxinteger, 0, 0)",
    "return cube.count(2^31, 0, 0, 2^32, 0, 0)",
    "local n = 0 for x, y, z, v in cube.cells(-5, -5, -5, 5, 5, 5) do n = n + #v end return n",
    "return #cube.walk(100, 'both'), #cube.walk(-1), #cube.edges('in', 'e')",
    "return #cube.walk(3, 'sideways')",
    "return cube.edges('both')[1].label",
    "cube.put(0, 0, 0, string.rep('y', 5000))",
    "cube.put(0, 0, 0, {})",
    "cube.put(0 / 0, 0, 0, 1)",
    "cube.put(1e300, 0, 0, 1)",
    "cube.rput(2147483647, 0, 0, 1)",
    "return cube.run()",
    "cube.x = 5 return cube.x",
    "rawset(string, 'rep', nil)",
    "string.rep = nil",
    "return getmetatable('').__index",
    "return io, os, debug, package, coroutine, require, load, print, collectgarbage",
    "return string.dump",
    "return _ENV, _G",
    "x = 1 return x",
    "return select('#', ...), ...",
    "return select(-1, ...)",
    "return cube.now() > 0",
    "return math.random(1, 6)",
    "return math.random(0)",
    "return tostring(cube), tostring(print)",
    "local t = {} for i = 1, 4096 do t['k' .. i] = string.rep('v', 4096) end return t",
    "local t = {} for i = 1, 300 do t[i] = string.rep('v', 4000) end return t",
    "cube.put(0, 0, 0, 1) error('after a write')",
    "for i = 1, 100 do cube.put(i, i, i, i) end while true do end",
    "cube.del(1, 0, 0) cube.del(0, 1, 0) local s = 'x' while true do s = s .. s end",
];

/// Lua tokens the token soup draws from.
const TOKENS: &[&str] = &[
    "local",
    "function",
    "end",
    "return",
    "if",
    "then",
    "else",
    "elseif",
    "while",
    "do",
    "for",
    "in",
    "repeat",
    "until",
    "break",
    "goto",
    "::l::",
    "and",
    "or",
    "not",
    "nil",
    "true",
    "false",
    "...",
    "=",
    "==",
    "~=",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "^",
    "#",
    "&",
    "|",
    "~",
    "<<",
    ">>",
    "..",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ";",
    ":",
    ",",
    ".",
    "x",
    "y",
    "t",
    "s",
    "i",
    "0",
    "1",
    "-1",
    "1e308",
    "0x7fffffffffffffff",
    "2^63",
    "0.5",
    "'a'",
    "\"\"",
    "[[z]]",
    "cube",
    "cube.get",
    "cube.put",
    "cube.del",
    "cube.num",
    "cube.incr",
    "cube.rget",
    "cube.rput",
    "cube.rincr",
    "cube.count",
    "cube.sum",
    "cube.cells",
    "cube.edges",
    "cube.walk",
    "cube.now",
    "string.rep",
    "string.sub",
    "string.find",
    "table.concat",
    "table.sort",
    "table.insert",
    "setmetatable",
    "getmetatable",
    "pcall",
    "error",
    "tostring",
    "tonumber",
    "pairs",
    "ipairs",
    "select",
    "math.huge",
    "math.maxinteger",
    "utf8.char",
];

/// SplitMix64: seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Mostly small coordinates, now and then one the API must refuse or
    /// clamp.
    fn coord_arg(&mut self) -> String {
        if self.below(4) != 0 {
            return (self.below(7) as i64 - 3).to_string();
        }
        self.pick(&[
            "0",
            "1",
            "-1",
            "2",
            "5",
            "x",
            "2147483647",
            "-2147483648",
            "1e10",
            "0.5",
            "nil",
            "'1'",
            "math.huge",
        ])
        .to_string()
    }
}

fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(200);
    (0..len)
        .map(|_| {
            if rng.below(4) == 0 {
                rng.next() as u8
            } else {
                b' ' + rng.below(95) as u8
            }
        })
        .collect()
}

fn token_soup(rng: &mut Rng) -> Vec<u8> {
    let n = 1 + rng.below(60);
    let mut out = String::new();
    for _ in 0..n {
        out.push_str(rng.pick(TOKENS));
        out.push(if rng.below(8) == 0 { '\n' } else { ' ' });
    }
    out.into_bytes()
}

/// A program that parses: statements calling the API with odd arguments,
/// loops with random bounds, and a random return.
fn generated(rng: &mut Rng) -> Vec<u8> {
    let mut out = String::from("local a, b = ...\nlocal t = {}\n");
    for _ in 0..1 + rng.below(6) {
        let (x, y, z) = (rng.coord_arg(), rng.coord_arg(), rng.coord_arg());
        let statement = match rng.below(10) {
            0 => format!("t[#t + 1] = cube.get({x}, {y}, {z})"),
            1 => format!(
                "cube.put({x}, {y}, {z}, {})",
                rng.pick(&["a", "b", "1", "'v'", "t", "0/0", "string.rep('q', 5000)"])
            ),
            2 => format!("t[#t + 1] = cube.del({x}, {y}, {z})"),
            3 => format!("t[#t + 1] = cube.incr({x}, {y}, {z}, {})", rng.coord_arg()),
            4 => format!(
                "t[#t + 1] = cube.count({x}, {y}, {z}, {}, {}, {})",
                rng.coord_arg(),
                rng.coord_arg(),
                rng.coord_arg()
            ),
            5 => format!("t[#t + 1] = cube.sum(-2, -2, -2, {x}, {y}, {z})"),
            6 => format!(
                "for i = 1, {} do t[#t + 1] = {} end",
                rng.pick(&["10", "1000", "100000", "1e9", "tonumber(a) or 3"]),
                rng.pick(&[
                    "i",
                    "string.rep('z', i)",
                    "cube.rget(i, 0, 0)",
                    "{i}",
                    "cube.rincr(0, 0, 0)"
                ])
            ),
            7 => format!(
                "t[#t + 1] = #cube.walk({x}, {})",
                rng.pick(&["'out'", "'in'", "'both'", "'up'", "nil"])
            ),
            8 => format!("t[#t + 1] = pcall(cube.num, {x}, {y}, {z})"),
            _ => format!("if {x} == {y} then error({z}) end"),
        };
        out.push_str(&statement);
        out.push('\n');
    }
    out.push_str(rng.pick(&[
        "return t",
        "return #t",
        "return t[1]",
        "return a, b",
        "return {n = #t, first = t[1]}",
        "return",
        "return t, t",
    ]));
    out.into_bytes()
}

/// One of the hostile programs, mutated a few times.
fn mutated(rng: &mut Rng) -> Vec<u8> {
    let mut source = rng.pick(HOSTILE).as_bytes().to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = source.len() as u64;
        match rng.below(5) {
            0 if len > 0 => {
                let i = rng.below(len) as usize;
                source[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len) as usize;
                let n = (1 + rng.below(8) as usize).min(source.len() - at);
                source.drain(at..at + n);
            }
            2 => {
                let at = rng.below(len + 1) as usize;
                let token = format!(" {} ", rng.pick(TOKENS));
                source.splice(at..at, token.into_bytes());
            }
            3 if len > 0 => {
                let at = rng.below(len) as usize;
                let chunk = source[at..].to_vec();
                source.extend_from_slice(&chunk);
            }
            _ => {
                let other = rng.pick(HOSTILE).as_bytes();
                source.push(b'\n');
                source.extend_from_slice(other);
            }
        }
    }
    source
}

fn args(rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..rng.below(4))
        .map(|_| match rng.below(4) {
            0 => rng
                .pick(&["1", "-0", "1e308", "nan", "9223372036854775807", "", "0x10"])
                .as_bytes()
                .to_vec(),
            1 => random_bytes(rng),
            _ => rng.below(100).to_string().into_bytes(),
        })
        .collect()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn shown(source: &[u8]) -> String {
    let text = String::from_utf8_lossy(source);
    let cut: String = text.chars().take(2000).collect();
    format!("{cut:?}{}", if cut.len() < text.len() { "..." } else { "" })
}

#[test]
fn any_source_runs_within_its_budgets_or_is_refused() {
    let seed = env_u64("CUBE_GARBAGE_SEED").unwrap_or(1);
    let (cases, wall) = match env_u64("CUBE_GARBAGE_CASES") {
        Some(n) => (n, Duration::MAX),
        None => (DEFAULT_CASES, DEFAULT_WALL),
    };
    let limits = HarnessLimits::SMALL;
    let mut rng = Rng(seed);
    let mut harness = ProgramHarness::new(limits).unwrap();
    let started = Instant::now();
    let (mut ran, mut refused, mut failed) = (0u64, 0u64, 0u64);
    let total = HOSTILE.len() as u64 + cases;
    let mut case = 0;
    while case < total {
        if case >= HOSTILE.len() as u64 && started.elapsed() > wall {
            break;
        }
        let (source, run_args) = match case.checked_sub(HOSTILE.len() as u64) {
            None => (
                HOSTILE[case as usize].as_bytes().to_vec(),
                vec![b"3".to_vec()],
            ),
            Some(_) => {
                let source = match rng.below(4) {
                    0 => random_bytes(&mut rng),
                    1 => token_soup(&mut rng),
                    2 => generated(&mut rng),
                    _ => mutated(&mut rng),
                };
                (source, args(&mut rng))
            }
        };
        if harness.runs() >= RUNS_PER_HARNESS {
            harness = ProgramHarness::new(limits).unwrap();
        }
        let expected_seq = harness.runs() + 1;
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| -> Result<Option<bool>, String> {
            match harness.run(&source, &run_args)? {
                HarnessOutcome::Refused(_) => Ok(None),
                HarnessOutcome::Ran(run) => {
                    run.check(&limits, expected_seq)?;
                    Ok(Some(run.result.is_ok()))
                }
            }
        }));
        match outcome {
            Ok(Ok(None)) => refused += 1,
            Ok(Ok(Some(true))) => ran += 1,
            Ok(Ok(Some(false))) => failed += 1,
            Ok(Err(why)) => panic!(
                "seed {seed}, case {case}: {why}\n  source: {}\n  args: {run_args:?}",
                shown(&source)
            ),
            Err(_) => panic!(
                "seed {seed}, case {case}: panicked (message above)\n  source: {}\n  args: {run_args:?}",
                shown(&source)
            ),
        }
        case += 1;
    }
    eprintln!(
        "seed {seed}: {case} sources in {:.1} s: {ran} ran, {failed} failed within their budgets, \
         {refused} refused by prog",
        started.elapsed().as_secs_f64()
    );
    // Each kind of outcome happened: the generators reach past the parser.
    assert!(
        ran > 10 && failed > 10 && refused > 10,
        "{ran} {failed} {refused}"
    );
}
