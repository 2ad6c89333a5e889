-- The Lua modules form no require cycle: every module under lua/tetra/ and every recipe
-- is read as text, each require in it (at the top or inside a function) is an edge, and
-- the graph has no cycle. A require inside a function hides a cycle from the loader (it
-- runs after both modules loaded) but not from a reader: the layers still lean on each
-- other. Dynamic requires count too: require("a.b." .. x) leads to every module of the
-- folder a/b, require(name) to every module the file names in a string.
local host = require("tetra.host")

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local root = here .. "/../.."

-- -- Reading Lua source ----------------------------------------------------------------

-- The tokens of Lua source src: { kind = "name" | "string" | "op", value, line }, without
-- comments and whitespace (a string's value is its text between the quotes).
local function tokens(src)
  local out, pos, line = {}, 1, 1
  local function push(kind, value) out[#out + 1] = { kind = kind, value = value, line = line } end
  -- Skips a long bracket whose opening "[" starts at pos; returns its contents.
  local function long_bracket()
    local eq = src:match("^%[(=*)%[", pos)
    if not eq then return nil end
    local close = "]" .. eq .. "]"
    local first = pos + #eq + 2
    local last = src:find(close, first, true)
    if not last then error(("unfinished long bracket at line %d"):format(line)) end
    local body = src:sub(first, last - 1)
    for _ in body:gmatch("\n") do line = line + 1 end
    pos = last + #close
    return body
  end
  while pos <= #src do
    local c = src:sub(pos, pos)
    if c == "\n" then
      line, pos = line + 1, pos + 1
    elseif c:match("%s") then
      pos = pos + 1
    elseif src:sub(pos, pos + 1) == "--" then
      pos = pos + 2
      if not long_bracket() then pos = (src:find("\n", pos, true) or #src + 1) end
    elseif c == "[" and src:match("^%[=*%[", pos) then
      local start = line
      local body = long_bracket()
      out[#out + 1] = { kind = "string", value = body, line = start }
    elseif c == '"' or c == "'" then
      local i, parts = pos + 1, {}
      while true do
        local d = src:sub(i, i)
        if d == "" or d == "\n" then error(("unfinished string at line %d"):format(line)) end
        if d == c then break end
        if d == "\\" then
          if src:sub(i + 1, i + 1) == "\n" then line = line + 1 end
          parts[#parts + 1] = src:sub(i, i + 1)
          i = i + 2
        else
          parts[#parts + 1] = d
          i = i + 1
        end
      end
      push("string", table.concat(parts))
      pos = i + 1
    elseif c:match("[%a_]") then
      local name = src:match("^[%w_]+", pos)
      push("name", name)
      pos = pos + #name
    elseif c:match("%d") then
      pos = pos + #src:match("^[%w%.]+", pos)
    elseif src:sub(pos, pos + 1) == ".." then
      push("op", src:sub(pos, pos + 2) == "..." and "..." or "..")
      pos = pos + #out[#out].value
    else
      push("op", c)
      pos = pos + 1
    end
  end
  return out
end

local function is(tok, kind, value)
  return tok ~= nil and tok.kind == kind and (value == nil or tok.value == value)
end

-- The requires of src, as { { kind = "literal" | "prefix" | "variable", name, line } }:
-- require "m", require("m"), require("m." .. x), require(x), and require passed as a
-- value (pcall(require, "m." .. x)). Any other form is an error naming its line, so a
-- require the scan cannot follow never goes unseen.
local function requires(src)
  local toks, out = tokens(src), {}
  for i, t in ipairs(toks) do
    -- A field named require (t.require) is not the global function.
    local field = is(toks[i - 1], "op", ".") or is(toks[i - 1], "op", ":")
    if is(t, "name", "require") and not field then
      local a, b, c = toks[i + 1], toks[i + 2], toks[i + 3]
      local arg, after
      if is(a, "string") then
        arg = a
      elseif is(a, "op", "(") or is(a, "op", ",") then
        arg, after = b, c
      end
      if is(arg, "string") and not is(after, "op", "..") then
        out[#out + 1] = { kind = "literal", name = arg.value, line = t.line }
      elseif is(arg, "string") then
        out[#out + 1] = { kind = "prefix", name = arg.value, line = t.line }
      elseif is(a, "op", "(") and is(arg, "name") and is(after, "op", ")") then
        out[#out + 1] = { kind = "variable", name = arg.value, line = t.line }
      else
        error(("line %d: a require this scan cannot follow (use a string, \"prefix.\" .. " ..
               "name, or one variable)"):format(t.line))
      end
    end
  end
  return out
end

-- Every string literal of src (the names a require(variable) may take).
local function strings(src)
  local out = {}
  for _, t in ipairs(tokens(src)) do
    if t.kind == "string" then out[#out + 1] = t.value end
  end
  return out
end

-- -- The module graph ------------------------------------------------------------------

-- A tree of Lua sources: tree.modules (name -> source text; a recipe's name is its path)
-- and tree.folder(name) (the modules of folder "a.b", for require("a.b." .. x)).
local function disk_tree(dir)
  local modules = {}
  local function walk(path, prefix, by_path)
    for _, f in ipairs(assert(host.listdir(path))) do
      local full = path .. "/" .. f
      if host.is_dir(full) then
        walk(full, (by_path and prefix .. "/" or prefix .. ".") .. f, by_path)
      elseif f:match("%.lua$") then
        local name
        if by_path then
          name = prefix .. "/" .. f
        else
          name = f == "init.lua" and prefix or prefix .. "." .. f:sub(1, -5)
        end
        local fh = assert(io.open(full, "rb"))
        modules[name] = fh:read("*a")
        fh:close()
      end
    end
  end
  walk(dir .. "/lua/tetra", "tetra", false)   -- lua/tetra/init.lua is module tetra
  walk(dir .. "/recipes", "recipes", true)
  return { modules = modules }
end

-- The modules of folder `prefix` ("a.b." without the dot), not the folder's own init.
local function folder(tree, prefix)
  local out = {}
  for name in pairs(tree.modules) do
    if name:sub(1, #prefix + 1) == prefix .. "." and not name:find(".", #prefix + 2, true) then
      out[#out + 1] = name
    end
  end
  table.sort(out)
  return out
end

-- name -> sorted array of the modules it requires (modules outside the tree, such as ffi
-- or the host's tetra.host, are left out: they require nothing of ours).
local function graph(tree)
  local g = {}
  for name, src in pairs(tree.modules) do
    local ok, reqs = pcall(requires, src)
    if not ok then error(name .. ": " .. tostring(reqs), 0) end
    local set = {}
    for _, r in ipairs(reqs) do
      local targets
      if r.kind == "literal" then
        targets = { r.name }
      elseif r.kind == "prefix" then
        targets = folder(tree, (r.name:gsub("%.$", "")))
        if #targets == 0 then
          error(("%s:%d: require(%q .. x) names no folder of modules"):format(name, r.line, r.name), 0)
        end
      else
        targets = strings(src)
      end
      for _, m in ipairs(targets) do
        if tree.modules[m] and m ~= name then set[m] = true end
      end
    end
    local list = {}
    for m in pairs(set) do list[#list + 1] = m end
    table.sort(list)
    g[name] = list
  end
  return g
end

-- The cycles of graph g, one per strongly connected component of more than one module:
-- { path = "a -> b -> c -> a", modules = the component's modules, sorted } (a: the
-- component's first module by name; the path is a shortest one back to it). Sorted by
-- path, so the report is the same on every run.
local function cycles(g)
  local names = {}
  for name in pairs(g) do names[#names + 1] = name end
  table.sort(names)
  -- Tarjan's strongly connected components.
  local index, low, on_stack, stack, comps, counter = {}, {}, {}, {}, {}, 0
  local function connect(v)
    counter = counter + 1
    index[v], low[v] = counter, counter
    stack[#stack + 1], on_stack[v] = v, true
    for _, w in ipairs(g[v]) do
      if not index[w] then
        connect(w)
        low[v] = math.min(low[v], low[w])
      elseif on_stack[w] then
        low[v] = math.min(low[v], index[w])
      end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat
        local w = table.remove(stack)
        on_stack[w] = nil
        comp[#comp + 1] = w
      until w == v
      if #comp > 1 then comps[#comps + 1] = comp end
    end
  end
  for _, v in ipairs(names) do
    if not index[v] then connect(v) end
  end
  local out = {}
  for _, comp in ipairs(comps) do
    table.sort(comp)
    local inside = {}
    for _, v in ipairs(comp) do inside[v] = true end
    -- Breadth-first from the first module back to itself, inside the component.
    local start, from, queue, path = comp[1], {}, { comp[1] }, nil
    local head = 1
    while not path do
      local v = queue[head]
      head = head + 1
      for _, w in ipairs(g[v]) do
        if w == start then
          path = { start }
          local u = v
          while u ~= start do table.insert(path, 2, u); u = from[u] end
          path[#path + 1] = start
          break
        elseif inside[w] and not from[w] then
          from[w] = v
          queue[#queue + 1] = w
        end
      end
    end
    out[#out + 1] = { path = table.concat(path, " -> "), modules = comp }
  end
  table.sort(out, function(x, y) return x.path < y.path end)
  return out
end

local function paths(list)
  local out = {}
  for i, c in ipairs(list) do out[i] = c.path end
  return out
end

-- -- The scan on small sources ---------------------------------------------------------

local function tree_of(modules) return { modules = modules } end

describe("the require scan", function()
  it("reads every form of require, and no require in a comment or a string", function()
    local src = [==[
      local a = require("a")
      local b = require 'b'
      local function later() return require("c").x end
      -- require("not_this")
      --[[ require("nor_this") ]]
      local s = "require('nor_this_either')"
      local t = [[require("no")]]
      local ok, m = pcall(require, "d." .. name)
      local e = require("e." .. name)
      local f = require(name)
      local g = require "g"
      local h = obj.require("h")
    ]==]
    local got = {}
    for _, r in ipairs(requires(src)) do got[#got + 1] = r.kind .. " " .. r.name .. " " .. r.line end
    expect(got).to_equal({ "literal a 1", "literal b 2", "literal c 3", "prefix d. 8",
                           "prefix e. 9", "variable name 10", "literal g 11" })
  end)

  it("refuses a require it cannot follow", function()
    expect(function() requires("local x = require(prefix .. 'x')") end)
      .to_error("line 1: a require this scan cannot follow")
  end)

  it("follows a dynamic require to every module of its folder, a variable to the file's names", function()
    local g = graph(tree_of({
      a = "local function f(n) return require('a.parts.' .. n) end",
      ["a.parts.x"] = "", ["a.parts.y"] = "", ["a.parts.y.z"] = "",
      c = "local names = { 'a.parts.y', 'a' }\nlocal function f(k) return require(k) end",
    }))
    expect(g.a).to_equal({ "a.parts.x", "a.parts.y" })
    expect(g.c).to_equal({ "a", "a.parts.y" })
  end)

  it("names every cycle, a require inside a function included", function()
    local g = graph(tree_of({
      a = "local b = require('b')",
      b = "local function f() return require('c') end",
      c = "return { go = function() return require('a') end }",
      d = "require('e')", e = "local x = require('d')",
      f = "require('a')",
    }))
    expect(paths(cycles(g))).to_equal({ "a -> b -> c -> a", "d -> e -> d" })
  end)

  it("finds a cycle through a folder's dynamic require", function()
    expect(paths(cycles(graph(tree_of({
      p = "return setmetatable({}, { __index = function(_, k) return require('p.' .. k) end })",
      ["p.q"] = "local p = require('p')",
    }))))).to_equal({ "p -> p.q -> p" })
  end)

  it("finds none in a graph that points one way", function()
    expect(paths(cycles(graph(tree_of({ a = "require('b'); require('c')", b = "require('c')",
                                        c = "" })))))
      .to_equal({})
  end)
end)

-- -- The tree --------------------------------------------------------------------------

describe("lua/tetra and recipes", function()
  it("are read whole", function()
    local tree = disk_tree(root)
    expect(tree.modules.tetra).to_match("local submodules")
    expect(tree.modules["tetra.train"]).to_be_a("string")
    expect(tree.modules["tetra.parallel.layout"]).to_be_a("string")
    expect(tree.modules["recipes/llama.lua"]).to_be_a("string")
    -- tetra.config's schema folder is reached through its dynamic require.
    local g = graph(tree)
    local set = {}
    for _, m in ipairs(g["tetra.config"]) do set[m] = true end
    expect(set["tetra.config.schema.fault"]).to_be(true)
  end)

  it("have no require cycle", function()
    local found = cycles(graph(disk_tree(root)))
    if #found > 0 then
      local lines = {}
      for _, c in ipairs(found) do
        lines[#lines + 1] = c.path
        if #c.modules > 2 then
          lines[#lines + 1] = "  (one knot of " .. #c.modules .. " modules: " ..
                              table.concat(c.modules, ", ") .. ")"
        end
      end
      error("require cycles (break each so the layers point one way):\n  " ..
            table.concat(lines, "\n  "), 0)
    end
  end)
end)
