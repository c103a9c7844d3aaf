-- The cell-program sandbox, built once per Lua VM (server/src/programs/sandbox.rs).
-- Runs with the VM's full globals; returns the safe base table, the
-- metatable of per-run environments, and the raw `cube` API table.
-- Programs only ever see what is reachable from the per-run environment.

local budget_check, charge, D = ...

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

local function safe_xpcall(f, handler, ...)
  return after(raw_xpcall(f, handler, ...))
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

local function len_of(t)
  if type(t) == "table" then
    return #t
  end
  return 0
end

local function count(i, j)
  if type(i) == "number" and type(j) == "number" and j >= i then
    return j - i + 1
  end
  return 0
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
S.find = function(s, pattern, init, plain)
  if plain ~= true then
    error("string.find: only plain search is available in cell programs "
      .. "(pass true as the fourth argument): " .. NO_PATTERNS, 2)
  end
  return raw_find(s, pattern, init, true)
end
S.rep = function(s, n, sep)
  if type(n) == "number" and n >= 1 then
    local unit = #tostring(s)
    if sep ~= nil then
      unit = unit + #tostring(sep)
    end
    -- An empty result would loop n times in C without allocating.
    if unit == 0 then
      return ""
    end
    charge(n * unit // 64 + 1)
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
local raw_unpack, raw_insert, raw_remove = table.unpack, table.insert, table.remove
T.move = function(a1, f, e, t, a2)
  charge(count(f, e))
  return raw_move(a1, f, e, t, a2)
end
T.sort = function(t, comp)
  local n = len_of(t)
  if n > 1 then
    charge(n * math_floor(math_log(n, 2) + 1))
  end
  return raw_sort(t, comp)
end
T.concat = function(t, sep, i, j)
  charge(count(i or 1, j or len_of(t)))
  return raw_concat(t, sep, i, j)
end
T.unpack = function(t, i, j)
  charge(count(i or 1, j or len_of(t)))
  return raw_unpack(t, i, j)
end
T.insert = function(t, ...)
  if select("#", ...) >= 2 then
    local pos = ...
    if type(pos) == "number" then
      charge(len_of(t) - pos + 1)
    end
  end
  return raw_insert(t, ...)
end
T.remove = function(t, pos)
  if type(pos) == "number" then
    charge(len_of(t) - pos + 1)
  end
  return raw_remove(t, pos)
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
local api = {}
function api.get(x, y, z) return D(1, x, y, z) end
function api.put(x, y, z, v) return D(2, x, y, z, v) end
function api.del(x, y, z) return D(3, x, y, z) end
function api.num(x, y, z) return D(4, x, y, z) end
function api.incr(x, y, z, d) return D(5, x, y, z, d) end
function api.rget(dx, dy, dz) return D(17, dx, dy, dz) end
function api.rput(dx, dy, dz, v) return D(18, dx, dy, dz, v) end
function api.rdel(dx, dy, dz) return D(19, dx, dy, dz) end
function api.rnum(dx, dy, dz) return D(20, dx, dy, dz) end
function api.rincr(dx, dy, dz, d) return D(21, dx, dy, dz, d) end
function api.count(x0, y0, z0, x1, y1, z1) return D(32, x0, y0, z0, x1, y1, z1) end
function api.sum(x0, y0, z0, x1, y1, z1) return D(33, x0, y0, z0, x1, y1, z1) end
function api.rcount(x0, y0, z0, x1, y1, z1) return D(48, x0, y0, z0, x1, y1, z1) end
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
  math = readonly("math", copy(math)),
  utf8 = readonly("utf8", copy(utf8)),
  cube = readonly("cube", api),
}

local env_meta = { __index = base, __metatable = false }

return base, env_meta, api
