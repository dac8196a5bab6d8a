-- Ember's Lua sandbox, run once in every new Lua state (eval or functions).
-- It builds what Redis 7.0's scripting environment shows a script:
-- read-only globals (writing one fails with "Attempt to modify a readonly
-- table", reading a missing one with "Script attempted to access
-- nonexistent global variable"), read-only library tables, the `redis`
-- API, `cjson`, `bit`, Redis's `math.random`, and a `pcall` that turns a
-- Redis error table into its message. Rust gives it `raw` (its functions)
-- and `mode` ("eval" or "function"); it returns the environment user code
-- runs in, the runner and the library-loading switch.
local raw, mode = ...

local rawget_, next_, pairs_, ipairs_ = rawget, next, pairs, ipairs
local setmetatable_, type_, error_, tostring_, tonumber_ = setmetatable, type, error, tostring, tonumber
local select_, setfenv_, loadstring_, load_, pcall_, xpcall_ = select, setfenv, loadstring, load, pcall, xpcall

-- The real tables behind read-only proxies (weak keys: proxies are few and
-- live as long as the state, but this costs nothing).
local backing = setmetatable_({}, { __mode = 'k' })

local function readonly(t)
  local p = {}
  backing[p] = t
  setmetatable_(p, {
    __index = t,
    __newindex = function() error_('Attempt to modify a readonly table', 2) end,
    __metatable = false,
  })
  return p
end

-- The globals Redis 7.0 leaves a script (its allow list), and the ones it
-- removes: everything else that Lua's base library defines goes.
local B = {}
for _, k in ipairs_({ 'assert', 'collectgarbage', 'coroutine', 'error', 'gcinfo', 'getmetatable',
  'ipairs', 'load', 'loadstring', 'math', 'next', 'pairs', 'pcall', 'rawequal', 'rawget', 'rawset',
  'select', 'setmetatable', 'string', 'table', 'tonumber', 'tostring', 'type', 'unpack', 'xpcall',
  '_VERSION' }) do
  B[k] = _G[k]
end

-- Whether a kill or an abort is pending: then no pcall may catch the error.
local function stopping() return raw.stopping() end

local function pfix(ok, ...)
  if ok then return ok, ... end
  if stopping() then error_((...), 0) end
  local e = ...
  if type_(e) == 'userdata' then e = raw.unwrap(e) end
  if type_(e) == 'table' then
    local m = rawget_(e, 'err')
    if type_(m) == 'string' then return false, m end
  end
  return false, e
end
B.pcall = function(f, ...) return pfix(pcall_(f, ...)) end
B.xpcall = function(f, h)
  return pfix(xpcall_(f, function(e) if stopping() then return e end return h(e) end))
end

-- Iteration and raw access see through the proxies.
B.pairs = function(t)
  local b = backing[t]
  if b then return next_, b, nil end
  return pairs_(t)
end
B.ipairs = function(t) return ipairs_(backing[t] or t) end
B.next = function(t, k) return next_(backing[t] or t, k) end
B.rawget = function(t, k) return rawget_(backing[t] or t, k) end
B.rawset = raw.rawset
B.setmetatable = raw.setmetatable

-- The environment of user code: every read of a missing global and every
-- write fails. While a library loads, reads go to the load API instead.
-- A table whose reads of a missing key fail (as a missing global) and
-- whose writes fail; `lookup` gives the values.
local function strict(lookup)
  return setmetatable_({}, {
    __index = function(_, k)
      local v = lookup(k)
      if v == nil then
        error_("Script attempted to access nonexistent global variable '" .. tostring_(k) .. "'", 2)
      end
      return v
    end,
    __newindex = function() error_('Attempt to modify a readonly table', 2) end,
    __metatable = false,
  })
end

-- A script's global reads go from the empty `env` to B through a table
-- __index (no Lua call per read, as a function __index would cost); B's own
-- __index raises for a missing global (level 2: the script's line). While a
-- library loads, `env` reads the load API instead.
local function missing(_, k)
  error_("Script attempted to access nonexistent global variable '" .. tostring_(k) .. "'", 2)
end
setmetatable_(B, { __index = missing })
local env_meta = {
  __index = B,
  __newindex = function() error_('Attempt to modify a readonly table', 2) end,
  __metatable = false,
}
local env = setmetatable_({}, env_meta)
B._G = env
backing[env] = B

-- Code compiled inside a script runs in the same sandbox.
B.loadstring = function(s, name)
  local f, e = loadstring_(s, name)
  if f then setfenv_(f, env) end
  return f, e
end
B.load = function(fn, name)
  local f, e = load_(fn, name)
  if f then setfenv_(f, env) end
  return f, e
end


-- math: Redis's random generator (one rand48 sequence for the server).
local M = {}
for k, v in pairs_(math) do M[k] = v end
M.random = raw.random
M.randomseed = raw.randomseed
B.math = readonly(M)

local function copy(t)
  local c = {}
  for k, v in pairs_(t) do c[k] = v end
  return c
end
B.string = readonly(copy(string))
-- Methods on strings ('x'):upper() use the same read-only copy; the real
-- string metatable is not reachable.
do
  local smt = getmetatable('')
  smt.__index = B.string
  smt.__metatable = readonly({ __index = B.string })
end
B.table = readonly(copy(table))
B.coroutine = readonly(copy(coroutine))

B.cjson = readonly({
  encode = raw.json_encode,
  decode = raw.json_decode,
  null = raw.json_null,
})

B.cmsgpack = readonly({
  pack = raw.msgpack_pack,
  unpack = raw.msgpack_unpack,
  unpack_one = raw.msgpack_unpack_one,
  unpack_limit = raw.msgpack_unpack_limit,
})

B.struct = readonly({
  pack = raw.struct_pack,
  unpack = raw.struct_unpack,
  size = raw.struct_size,
})

local bit = {}
for _, n in ipairs_({ 'tobit', 'tohex', 'bnot', 'band', 'bor', 'bxor', 'lshift', 'rshift', 'arshift',
  'rol', 'ror', 'bswap' }) do
  bit[n] = raw['bit_' .. n]
end
B.bit = readonly(bit)

-- The redis API.
local R = {}
local function log_api(t)
  t.log = raw.log
  t.LOG_DEBUG, t.LOG_VERBOSE, t.LOG_NOTICE, t.LOG_WARNING = 0, 1, 2, 3
  t.REDIS_VERSION = raw.version
  t.REDIS_VERSION_NUM = raw.version_num
end
log_api(R)
-- Rust functions (C functions to Lua): an error they raise keeps the
-- script's frame on the stack, so the reply names the script's line.
R.call = raw.call
R.pcall = raw.pcall
R.acl_check_cmd = raw.acl
R.sha1hex = raw.sha1hex
R.setresp = raw.setresp
R.set_repl = raw.set_repl
R.error_reply = function(...)
  if select_('#', ...) ~= 1 or type_((...)) ~= 'string' then
    return { err = 'ERR wrong number or type of arguments' }
  end
  local e = ...
  if e:sub(1, 1) ~= '-' then e = '-' .. e end
  return { err = raw.errtext(e) }
end
R.status_reply = function(...)
  if select_('#', ...) ~= 1 or type_((...)) ~= 'string' then
    return { err = 'ERR wrong number or type of arguments' }
  end
  return { ok = (...) }
end
R.REPL_NONE, R.REPL_AOF, R.REPL_SLAVE, R.REPL_REPLICA, R.REPL_ALL = 0, 1, 2, 2, 3
if mode == 'eval' then
  -- Outside the debugger (SCRIPT DEBUG, which Ember does not have) Redis's
  -- breakpoint answers false and debug does nothing.
  R.replicate_commands = function() return true end
  R.breakpoint = function() return false end
  R.debug = function() end
end
B.redis = readonly(R)

-- While a library loads, its code sees only `redis` with
-- register_function, log and the version (as Redis 7.0).
local L = {}
log_api(L)
L.register_function = function(...)
  local ok, e = raw.register(...)
  if not ok then error_({ err = e }, 0) end
end
local libapi_redis = strict(function(k) return L[k] end)
local libapi = { redis = libapi_redis }
-- `env`'s reads while a library loads.
local function loading(_, k)
  local v = libapi[k]
  if v == nil then
    error_("Script attempted to access nonexistent global variable '" .. tostring_(k) .. "'", 2)
  end
  return v
end

-- Error handler: the error as a table {err=, source=, line=}, with the
-- position of the innermost user code frame (Redis's __redis__err__handler).
local function handler(e)
  if type_(e) == 'userdata' then e = raw.unwrap(e) end
  if type_(e) ~= 'table' then e = { err = 'ERR ' .. tostring_(e) } end
  local src, line = raw.where()
  if src then
    e.source = src
    e.line = line
  end
  return e
end

if mode == 'eval' then B.__redis__err__handler = handler end

-- Runs a compiled script: an EVAL script sees KEYS and ARGV as globals
-- (set here, in Lua, which costs less than from Rust), a function gets
-- them as its arguments.
local function run(f, keys, args, eval)
  if eval then
    B.KEYS, B.ARGV = keys, args
    return xpcall_(f, handler)
  end
  return xpcall_(function() return f(keys, args) end, handler)
end

-- Runs a library's body with the load API (no handler: Redis reports
-- load errors without a position suffix).
local function load_library(f)
  env_meta.__index = loading
  local ok, e = pcall_(f)
  env_meta.__index = B
  return ok, e
end

return env, run, load_library
