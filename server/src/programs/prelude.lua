-- The cell-program sandbox, built once per Lua VM (server/src/programs/sandbox.rs).
-- Runs with the VM's full globals; returns the safe base table, the
-- metatable of per-run environments, and the raw `cube` API table.
-- Programs only ever see what is reachable from the per-run environment.

local budget_check, charge, D, F = ...

local type, tostring, tonumber, select, error = type, tostring, tonumber, select, error
local pairs, ipairs, next, rawget, rawlen, rawequal = pairs, ipairs, next, rawget, rawlen, rawequal
local raw_pcall, raw_xpcall = pcall, xpcall
local raw_setmetatable, raw_getmetatable, raw_rawset = setmetatable, getmetatable, rawset
local math_log, math_floor = math.log, math.floor

-- Protected calls cannot swallow a spent budget (fuel, time, memory):
-- after the call, a spent budget is raised again, all the way out.
local function after(ok, ...)
  local why = budget_check(ok, (...))
  if why then
    error(why, 0)
  end
  return ok, ...
end

local function safe_pcall(f, ...)
  return after(raw_pcall(f, ...))
end

-- A message handler runs where the error was raised, before the stack
-- unwinds. When that error is the count hook's (fuel or time spent), it
-- runs inside the hook, where Lua turns hooks off: a handler that looped
-- there was never counted nor timed again, and held the writer for ever.
-- So the program's handler runs only for errors raised while the budget
-- holds (with hooks on, counted like any code); once the budget is spent
-- the error passes through untouched, and `after` raises it again.
local function safe_xpcall(f, handler, ...)
  if type(handler) ~= "function" then
    return raw_xpcall(f, handler, ...) -- xpcall's own argument error
  end
  return after(raw_xpcall(f, function(e)
    if budget_check(true, nil) then
      return e
    end
    return handler(e)
  end, ...))
end

-- Tables shared by every run are read-only proxies; `rawset` refuses them.
local protected = raw_setmetatable({}, { __mode = "k" })

local function readonly(name, t)
  local proxy = raw_setmetatable({}, {
    __index = t,
    __newindex = function()
      error(name .. " is read-only in cell programs", 2)
    end,
    __metatable = false,
  })
  protected[proxy] = true
  return proxy
end

local function safe_rawset(t, k, v)
  if protected[t] then
    error("rawset: library tables are read-only in cell programs", 2)
  end
  return raw_rawset(t, k, v)
end

-- A __gc finaliser would run at some later collection, outside its run's
-- budget; refuse it.
local function safe_setmetatable(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("setmetatable: __gc metamethods are not allowed in cell programs", 2)
  end
  return raw_setmetatable(t, mt)
end

local function unavailable(name, why)
  return function()
    error(name .. " is not available in cell programs: " .. why, 2)
  end
end

local math_tointeger, math_maxinteger = math.tointeger, math.maxinteger

-- The size arguments of the wrapped library functions are converted once,
-- here, and the raw function is called with the converted value: the raw
-- functions accept numeric strings ('1e15') and floats with an integer
-- value, so a charge that looked at the argument's type alone could be
-- skipped, and the C loop then ran unpaid.
-- `level` is error's: 3 from a wrapper's own body, 4 from a helper it calls.
local function arg_error(level, fname, n, why)
  error("bad argument #" .. n .. " to '" .. fname .. "' (" .. why .. ")", level)
end

local function int_arg(fname, n, x)
  local i = math_tointeger(tonumber(x))
  if i == nil then
    if tonumber(x) ~= nil then
      arg_error(4, fname, n, "number has no integer representation")
    end
    arg_error(4, fname, n, "number expected, got " .. type(x))
  end
  return i
end

local function opt_int(fname, n, x, default)
  if x == nil then
    return default
  end
  return int_arg(fname, n, x) -- a tail call: errors still name the wrapper's caller
end

-- The length of a string argument (numbers are read as strings, as the
-- raw functions do; nothing else is, so no __tostring runs here).
local function str_len(fname, n, s)
  local t = type(s)
  if t == "string" then
    return #s
  elseif t == "number" then
    return #tostring(s)
  end
  arg_error(4, fname, n, "string expected, got " .. t)
end

-- A table without a metatable: the raw functions' C loops read and write
-- it directly, one step per element, so a charge per element pays for
-- them. With a metatable, each element access may run a chain of up to
-- 2000 __index tables (or a __len that answers differently each time)
-- inside one C call; those tables are handled element by element in Lua
-- instead, where the instruction hook counts and times every access.
local function plain(t)
  return type(t) == "table" and raw_getmetatable(t) == nil
end

-- A table's length, read once (through __len, if it has one) and checked
-- as the raw functions check it.
local function length(fname, t)
  if type(t) ~= "table" then
    arg_error(4, fname, 1, "table expected, got " .. type(t))
  end
  if raw_getmetatable(t) == nil then
    return rawlen(t)
  end
  local n = math_tointeger(tonumber(#t))
  if n == nil then
    error("object length is not an integer", 3)
  end
  return n
end

-- Charges for `n` elements (a float: no integer wrap-around).
local function charge_count(i, j)
  if j >= i then
    charge((j + 0.0) - i + 1)
  end
end

-- The string library is reachable from every string value (s:upper()),
-- so it is cleaned in place.
local S = string
local raw_rep, raw_find = S.rep, S.find
local NO_PATTERNS = "Lua patterns can backtrack inside one library call for longer than "
  .. "any instruction budget can interrupt"
S.dump = nil
S.match = unavailable("string.match", NO_PATTERNS)
S.gmatch = unavailable("string.gmatch", NO_PATTERNS)
S.gsub = unavailable("string.gsub", NO_PATTERNS)
S.find = function(s, pattern, init, plain_search)
  if plain_search ~= true then
    error("string.find: only plain search is available in cell programs "
      .. "(pass true as the fourth argument): " .. NO_PATTERNS, 2)
  end
  local ls, lp = str_len("find", 1, s), str_len("find", 2, pattern)
  init = opt_int("find", 3, init, 1)
  -- Where the search starts, as the raw function reads `init`.
  if init < 0 then
    init = init < -ls and 1 or ls + init + 1
  elseif init == 0 then
    init = 1
  end
  -- A plain search compares the pattern at every place it could start:
  -- (places) * #pattern bytes at worst, in one C call.
  local places = ls - init + 1 - lp + 1
  if lp > 1 and places > 0 then
    charge((places + 0.0) * lp / 64)
  end
  return raw_find(s, pattern, init, true)
end
S.rep = function(s, n, sep)
  n = int_arg("rep", 2, n)
  if n >= 1 then
    local unit = str_len("rep", 1, s)
    if sep ~= nil then
      unit = unit + str_len("rep", 3, sep)
    end
    -- An empty result would loop n times in C without allocating.
    if unit == 0 then
      return ""
    end
    charge((n + 0.0) * unit / 64 + 1)
  end
  return raw_rep(s, n, sep)
end
raw_getmetatable("").__metatable = false

-- A copy of the table library with its size-driven C loops paid for.
local T = {}
for k, v in pairs(table) do
  T[k] = v
end
local raw_move, raw_sort, raw_concat = table.move, table.sort, table.concat
local raw_unpack = table.unpack

-- table.move with its arguments converted and its elements paid for.
local function move(a1, f, e, t, a2)
  if a2 == nil then
    a2 = a1
  end
  if e < f then
    return a2
  end
  if not (f > 0 or e < math_maxinteger + f) then
    arg_error(3, "move", 3, "too many elements to move")
  end
  if t > math_maxinteger - (e - f) then
    arg_error(3, "move", 4, "destination wrap around")
  end
  charge_count(f, e)
  if plain(a1) and plain(a2) then
    return raw_move(a1, f, e, t, a2)
  end
  if type(a1) ~= "table" then
    arg_error(3, "move", 1, "table expected, got " .. type(a1))
  end
  if type(a2) ~= "table" then
    arg_error(3, "move", 5, "table expected, got " .. type(a2))
  end
  if t > e or t <= f or not rawequal(a1, a2) then
    for k = 0, e - f do
      a2[t + k] = a1[f + k]
    end
  else
    for k = e - f, 0, -1 do
      a2[t + k] = a1[f + k]
    end
  end
  return a2
end

-- Elements i..j of t in a plain table (1..n), read one by one in Lua.
local function plain_copy(t, i, j)
  local out = {}
  for k = i, j do
    out[k - i + 1] = t[k]
  end
  return out
end

T.move = function(a1, f, e, t, a2)
  f = int_arg("move", 2, f)
  e = int_arg("move", 3, e)
  t = int_arg("move", 4, t)
  return move(a1, f, e, t, a2)
end
T.sort = function(t, comp)
  local n = length("sort", t)
  if n <= 1 then
    return
  end
  local rounds = math_floor(math_log(n, 2) + 1)
  charge((n + 0.0) * rounds)
  local a = t
  if not plain(t) then
    a = plain_copy(t, 1, n)
  end
  -- Comparing strings costs their length in one C call each: pay for the
  -- longest, in every comparison.
  local longest = 0
  for k = 1, n do
    local v = a[k]
    if type(v) == "string" and #v > longest then
      longest = #v
    end
  end
  if longest > 16 then
    charge((n + 0.0) * rounds * (longest // 16))
  end
  raw_sort(a, comp)
  if a ~= t then
    for k = 1, n do
      t[k] = a[k]
    end
  end
end
T.concat = function(t, sep, i, j)
  i = opt_int("concat", 3, i, 1)
  if j == nil then
    j = length("concat", t)
  else
    j = int_arg("concat", 4, j)
  end
  charge_count(i, j)
  if j >= i and not plain(t) then
    if type(t) ~= "table" then
      arg_error(3, "concat", 1, "table expected, got " .. type(t))
    end
    return raw_concat(plain_copy(t, i, j), sep)
  end
  return raw_concat(t, sep, i, j)
end
T.unpack = function(t, i, j)
  i = opt_int("unpack", 2, i, 1)
  if j == nil then
    j = length("unpack", t)
  else
    j = int_arg("unpack", 3, j)
  end
  charge_count(i, j)
  if j >= i and not plain(t) then
    if type(t) ~= "table" then
      arg_error(3, "unpack", 1, "table expected, got " .. type(t))
    end
    if (j + 0.0) - i >= 1e6 then
      error("too many results to unpack", 2)
    end
    local out = plain_copy(t, i, j)
    return raw_unpack(out, 1, j - i + 1)
  end
  return raw_unpack(t, i, j)
end
-- insert and remove read the length once (the raw functions would read it
-- again, through __len, after the charge) and shift with `move`.
T.insert = function(t, ...)
  local e = length("insert", t) + 1
  local nargs = select("#", ...)
  if nargs == 1 then
    t[e] = (...)
    return
  elseif nargs ~= 2 then
    error("wrong number of arguments to 'insert'", 2)
  end
  local pos, v = ...
  pos = int_arg("insert", 2, pos)
  if pos < 1 or pos > e then
    arg_error(3, "insert", 2, "position out of bounds")
  end
  if e > pos then
    move(t, pos, e - 1, pos + 1)
  end
  t[pos] = v
end
T.remove = function(t, pos)
  local size = length("remove", t)
  pos = opt_int("remove", 2, pos, size)
  if pos ~= size and (pos < 1 or pos > size + 1) then
    arg_error(3, "remove", 2, "position out of bounds")
  end
  local v = t[pos]
  if pos < size then
    move(t, pos + 1, size, pos)
    pos = size
  end
  t[pos] = nil
  return v
end

local function copy(lib)
  local out = {}
  for k, v in pairs(lib) do
    out[k] = v
  end
  return out
end

-- The program API. D is the VM's dispatcher (made once; it serves the run
-- in progress); the op numbers are those of server/src/programs/api.rs.
-- F answers the common calls without mlua's callback machinery
-- (server/src/programs/api/fast.rs): true and the answer, or nothing when
-- D must answer (or raise the error). Each wrapper tail-calls D, so an
-- error names the program's line as it always did.
local api = {}
-- A cell call (op on x, y, z, and a value or an increment).
local function cell_call(op)
  return function(x, y, z, v)
    local ok, answer = F(op, x, y, z, v)
    if ok then return answer end
    return D(op, x, y, z, v)
  end
end
-- A box call (op on two corners).
local function box_call(op)
  return function(x0, y0, z0, x1, y1, z1)
    local ok, answer = F(op, x0, y0, z0, x1, y1, z1)
    if ok then return answer end
    return D(op, x0, y0, z0, x1, y1, z1)
  end
end
api.get, api.put, api.del, api.num, api.incr =
  cell_call(1), cell_call(2), cell_call(3), cell_call(4), cell_call(5)
api.rget, api.rput, api.rdel, api.rnum, api.rincr =
  cell_call(17), cell_call(18), cell_call(19), cell_call(20), cell_call(21)
api.count, api.rcount = box_call(32), box_call(48)
function api.sum(x0, y0, z0, x1, y1, z1) return D(33, x0, y0, z0, x1, y1, z1) end
function api.rsum(x0, y0, z0, x1, y1, z1) return D(49, x0, y0, z0, x1, y1, z1) end

local function iterate(flat)
  local i = -3
  return function()
    i = i + 4
    local x = flat[i]
    if x ~= nil then
      return x, flat[i + 1], flat[i + 2], flat[i + 3]
    end
  end
end
function api.cells(x0, y0, z0, x1, y1, z1) return iterate(D(34, x0, y0, z0, x1, y1, z1)) end
function api.rcells(x0, y0, z0, x1, y1, z1) return iterate(D(50, x0, y0, z0, x1, y1, z1)) end
function api.edges(direction, label) return D(64, direction, label) end
function api.walk(depth, direction, label) return D(65, depth, direction, label) end
function api.now() return D(80) end
function api.run()
  error("cube.run: a program cannot run another cell's program (see docs/programs.md, "
    .. "\"Calling other cells\")", 2)
end

-- One generator serves every run of every namespace: a program that could
-- seed it would fix what math.random returns to the runs after it.
local M = copy(math)
M.randomseed = unavailable("math.randomseed",
  "one generator serves every run, seeded by the daemon")

local base = {
  assert = assert,
  error = error,
  ipairs = ipairs,
  next = next,
  pairs = pairs,
  select = select,
  tonumber = tonumber,
  tostring = tostring,
  type = type,
  rawequal = rawequal,
  rawget = rawget,
  rawlen = rawlen,
  rawset = safe_rawset,
  getmetatable = raw_getmetatable,
  setmetatable = safe_setmetatable,
  pcall = safe_pcall,
  xpcall = safe_xpcall,
  _VERSION = _VERSION,
  string = readonly("string", S),
  table = readonly("table", T),
  math = readonly("math", M),
  utf8 = readonly("utf8", copy(utf8)),
  cube = readonly("cube", api),
}

local env_meta = { __index = base, __metatable = false }

return base, env_meta, api
