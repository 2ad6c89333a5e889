-- tetra.spec: the runner behind `tetra test PATH...`.
--
-- A spec file runs with these globals (its own environment, falling back to _G):
--   describe(name, fn)   groups tests; nests
--   it(name, fn)         one test
--   before_each(fn), after_each(fn)   run around every test of the enclosing describe
--   expect(v).to_be(x) / .to_equal(tbl) / .to_be_near(x, tol) / .to_be_close(ref, rtol, atol)
--     / .to_be_truthy() / .to_be_falsy() / .to_be_nil() / .to_be_a(typename)
--     / .to_match(pattern) / .to_error([pattern]) / .to_have_shape({...})
--   expect(v).never.to_be(x) negates any matcher. `expect(v):to_be(x)` works too.
-- Each failure prints its test path, message and location; the run ends with the line
-- "N passed, N failed". Exit status: 0 when everything passed, 1 otherwise.
-- `tetra test -v` lists each test and its time; `-f TEXT` runs the matching tests only.

local host = require("tetra.host")

local M = {}

-- -- Values as text (for failure messages) ------------------------------------------

local function show(v, depth)
  depth = depth or 0
  if type(v) == "string" then return ("%q"):format(v) end
  if type(v) == "number" then return ("%.10g"):format(v) end
  if type(v) == "table" and depth < 3 then
    local parts, n = {}, 0
    for i, x in ipairs(v) do
      n = i
      if i > 8 then parts[#parts + 1] = "..."; break end
      parts[#parts + 1] = show(x, depth + 1)
    end
    for k, x in pairs(v) do
      if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then
        if #parts > 12 then parts[#parts + 1] = "..."; break end
        parts[#parts + 1] = tostring(k) .. " = " .. show(x, depth + 1)
      end
    end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  local s = tostring(v)
  if #s > 200 then s = s:sub(1, 200) .. "..." end
  return s
end
M.show = show

local function deep_equal(a, b, path)
  if type(a) ~= type(b) then
    return false, ("%s: %s vs %s"):format(path, show(a), show(b))
  end
  if type(a) ~= "table" then
    if a == b then return true end
    return false, ("%s: %s vs %s"):format(path, show(a), show(b))
  end
  for k, v in pairs(a) do
    local ok, why = deep_equal(v, b[k], path .. "[" .. show(k) .. "]")
    if not ok then return false, why end
  end
  for k, v in pairs(b) do
    if a[k] == nil then return false, ("%s[%s]: missing, expected %s"):format(path, show(k), show(v)) end
  end
  return true
end

-- Flattens numbers / nested tables / tensors to a Lua array of numbers plus a shape.
local function flatten(v)
  if type(v) == "number" then return { v }, {} end
  if type(v) == "cdata" and v.tolist then
    local list = v:tolist()
    if type(list) == "number" then return { list }, {} end
    v = list
  end
  if type(v) ~= "table" then return nil end
  local out, shape = {}, {}
  local node = v
  while type(node) == "table" do shape[#shape + 1] = #node; node = node[1] end
  local function walk(x)
    if type(x) == "table" then for _, y in ipairs(x) do walk(y) end else out[#out + 1] = x end
  end
  walk(v)
  return out, shape
end

-- -- Matchers ------------------------------------------------------------------------
-- Each returns ok, message-when-not-ok, message-when-negated.

local matchers = {}

function matchers.to_be(a, b)
  return a == b, ("expected %s to be %s"):format(show(a), show(b)),
         ("expected %s not to be %s"):format(show(a), show(b))
end

function matchers.to_equal(a, b)
  local ok, why = deep_equal(a, b, "value")
  return ok, "not equal: " .. tostring(why), ("expected %s not to equal it"):format(show(a))
end

-- |a - b| <= tol * max(1, |b|): absolute near zero, relative for large values.
function matchers.to_be_near(a, b, tol)
  tol = tol or 1e-6
  if type(a) ~= "number" then return false, "expected a number, got " .. show(a), "" end
  local err = math.abs(a - b)
  return err <= tol * math.max(1, math.abs(b)),
         ("expected %s to be within %g of %s (difference %g)"):format(show(a), tol, show(b), err),
         ("expected %s not to be near %s"):format(show(a), show(b))
end

-- Elementwise |a - r| <= atol + rtol * |r| over numbers, tables or tensors.
function matchers.to_be_close(a, ref, rtol, atol)
  rtol, atol = rtol or 1e-5, atol or 1e-8
  local xa, sa = flatten(a)
  local xr, sr = flatten(ref)
  if not xa or not xr then return false, "to_be_close needs numbers, tables or tensors", "" end
  if #xa ~= #xr then
    return false, ("size mismatch: %d elements (shape %s) vs %d (shape %s)"):format(
      #xa, show(sa), #xr, show(sr)), ""
  end
  local worst, at = -1, 0
  for i = 1, #xa do
    local excess = math.abs(xa[i] - xr[i]) - (atol + rtol * math.abs(xr[i]))
    if excess ~= excess or math.abs(xa[i] - xr[i]) ~= math.abs(xa[i] - xr[i]) then excess = math.huge end
    if excess > worst then worst, at = excess, i end
  end
  if worst <= 0 then return true, "", "expected values not to be close" end
  return false, ("values differ beyond rtol %g atol %g: element %d is %s, expected %s"):format(
    rtol, atol, at, show(xa[at]), show(xr[at])), ""
end

function matchers.to_be_truthy(a)
  return not not a, "expected a truthy value, got " .. show(a), "expected a falsy value, got " .. show(a)
end

function matchers.to_be_falsy(a)
  return not a, "expected a falsy value, got " .. show(a), "expected a truthy value, got " .. show(a)
end

function matchers.to_be_nil(a)
  return a == nil, "expected nil, got " .. show(a), "expected a value, got nil"
end

function matchers.to_be_a(a, typename)
  return type(a) == typename, ("expected a %s, got %s"):format(typename, type(a)),
         ("expected something other than a %s"):format(typename)
end

function matchers.to_match(a, pattern)
  local ok = type(a) == "string" and a:find(pattern) ~= nil
  return ok, ("expected %s to match %s"):format(show(a), show(pattern)),
         ("expected %s not to match %s"):format(show(a), show(pattern))
end

-- expect(fn).to_error("pattern"): fn must raise an error whose message contains the
-- pattern (plain text match first, then Lua pattern).
function matchers.to_error(fn, pattern)
  local ok, err = pcall(fn)
  if ok then return false, "expected an error, none was raised", "" end
  local msg = type(err) == "table" and tostring(err.message or err) or tostring(err)
  if pattern and not (msg:find(pattern, 1, true) or msg:find(pattern)) then
    return false, ("expected an error matching %s, got %s"):format(show(pattern), show(msg)), ""
  end
  return true, "", "expected no error, got " .. show(msg)
end

function matchers.to_have_shape(t, shape)
  local got = type(t) == "cdata" and t:shape() or nil
  local ok = got ~= nil and deep_equal(got, shape, "shape")
  return ok, ("expected shape %s, got %s"):format(show(shape), show(got)),
         ("expected a shape other than %s"):format(show(shape))
end

local function expectation(value, negated)
  local e = {}
  for name, m in pairs(matchers) do
    e[name] = function(first, ...)
      -- Supports both expect(v).m(x) and expect(v):m(x).
      local args = { n = select("#", ...) + 1, first, ... }
      if first == e then args = { n = select("#", ...), ... } end
      local ok, msg, neg_msg = m(value, unpack(args, 1, args.n))
      if negated then ok, msg = not ok, neg_msg end
      if not ok then error(msg, 2) end
    end
  end
  if not negated then e.never = expectation(value, true) end
  return e
end

function M.expect(value) return expectation(value, false) end

-- -- Collection and running ----------------------------------------------------------

local function new_env(registry)
  local stack = { { name = nil, before = {}, after = {} } }
  local env = setmetatable({}, { __index = _G })
  function env.describe(name, fn)
    local parent = stack[#stack]
    stack[#stack + 1] = { name = name, parent = parent, before = {}, after = {} }
    fn()
    stack[#stack] = nil
  end
  function env.it(name, fn)
    registry[#registry + 1] = { name = name, fn = fn, group = stack[#stack] }
  end
  function env.before_each(fn) local g = stack[#stack]; g.before[#g.before + 1] = fn end
  function env.after_each(fn) local g = stack[#stack]; g.after[#g.after + 1] = fn end
  env.expect = M.expect
  return env
end

local function full_name(test)
  local parts = { test.name }
  local g = test.group
  while g do
    if g.name then table.insert(parts, 1, g.name) end
    g = g.parent
  end
  return table.concat(parts, " > ")
end

local function chain(group)
  local groups = {}
  while group do table.insert(groups, 1, group); group = group.parent end
  return groups
end

local function traceback_handler(err)
  local msg = type(err) == "table" and tostring(err.message or err) or tostring(err)
  return { message = msg, trace = debug.traceback("", 2) }
end

-- Runs one test: before_each hooks outermost first, the test, after_each innermost first.
local function run_test(test)
  local groups = chain(test.group)
  local ok, err = true, nil
  for _, g in ipairs(groups) do
    for _, fn in ipairs(g.before) do
      if ok then ok, err = xpcall(fn, traceback_handler) end
    end
  end
  if ok then ok, err = xpcall(test.fn, traceback_handler) end
  for i = #groups, 1, -1 do
    for _, fn in ipairs(groups[i].after) do
      local aok, aerr = xpcall(fn, traceback_handler)
      if ok and not aok then ok, err = aok, aerr end
    end
  end
  return ok, err
end

-- The files to run, and the folders given that hold none (each a failure: a wrong path
-- must not pass as "0 passed, 0 failed").
local function spec_files(paths)
  local files, empty = {}, {}
  for _, p in ipairs(paths) do
    if host.is_dir(p) then
      local names = host.listdir(p) or {}
      local n0 = #files
      for _, n in ipairs(names) do
        if n:match("_spec%.lua$") then files[#files + 1] = p:gsub("/$", "") .. "/" .. n end
      end
      if #files == n0 then empty[#empty + 1] = p end
    else
      files[#files + 1] = p
    end
  end
  return files, empty
end

-- Runs the spec files; returns passed, failed (also printed). opts: verbose, filter,
-- stop_at_failure (no test runs after the first that fails).
function M.run(paths, out, opts)
  out, opts = out or io.stdout, opts or {}
  local passed, failed = 0, 0
  local verbose = opts.verbose or os.getenv("TETRA_SPEC_VERBOSE") == "1"
  local function fail(where, err)
    failed = failed + 1
    out:write(("FAIL %s\n  %s\n"):format(where, err.message:gsub("\n", "\n  ")))
    if verbose and err.trace then out:write(err.trace:gsub("^\n", ""), "\n") end
  end
  local files, empty = spec_files(paths)
  for _, dir in ipairs(empty) do fail(dir, { message = "no *_spec.lua files in this folder" }) end
  local ran_any = false
  for _, file in ipairs(files) do
    local registry = {}
    local chunk, lerr = loadfile(file)
    if not chunk then
      fail(file, { message = lerr })
    else
      setfenv(chunk, new_env(registry))
      local ok, err = xpcall(chunk, traceback_handler)
      if not ok then
        fail(file .. " (while loading)", err)
      elseif #registry == 0 then
        fail(file, { message = "no tests found" })
      end
      for _, test in ipairs(registry) do
        if opts.stop_at_failure and failed > 0 then break end
        if opts.filter and not full_name(test):find(opts.filter, 1, true) then goto continue end
        ran_any = true
        local t0 = host.now()
        local tok, terr = run_test(test)
        if tok then
          passed = passed + 1
          if verbose then out:write(("ok   %s > %s (%.3f s)\n"):format(file, full_name(test), host.now() - t0)) end
        else
          fail(file .. ": " .. full_name(test), terr)
        end
        ::continue::
      end
    end
    out:flush()
    if opts.stop_at_failure and failed > 0 then
      out:write("stopped at the first failure\n")
      break
    end
  end
  if opts.filter and not ran_any and failed == 0 then
    fail("-f " .. opts.filter, { message = "no test's name contains it" })
  end
  out:write(("%d passed, %d failed\n"):format(passed, failed))
  out:flush()
  return passed, failed
end

-- `tetra test [-v] [-f TEXT] PATH...`: -v lists every test with its time and prints
-- tracebacks; -f runs only tests whose full name contains TEXT. With
-- TETRA_TEST_STOP_AT_FAILURE set (tools/mutate sets it: one failure catches a planted bug),
-- nothing runs after the first failure.
function M.main(args)
  local stop = os.getenv("TETRA_TEST_STOP_AT_FAILURE")
  local paths, opts = {}, { stop_at_failure = stop ~= nil and stop ~= "" }
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-v" or a == "--verbose" then
      opts.verbose = true
    elseif a == "-f" or a == "--filter" then
      i = i + 1
      opts.filter = args[i]
    else
      paths[#paths + 1] = a
    end
    i = i + 1
  end
  local _, failed = M.run(paths, nil, opts)
  return failed == 0 and 0 or 1
end

return M
