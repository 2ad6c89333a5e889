-- tetra.util: the one JSON codec, the one user-error type (and the CLI's usage error),
-- the shared file helpers.
local json = require("tetra.util.json")
local errors = require("tetra.util.errors")
local fs = require("tetra.util.fs")

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  fs.mkdir_p(d, "util_spec")
  return d
end

-- The error fn raises (pcall's second result).
local function raised(fn, ...)
  local ok, e = pcall(fn, ...)
  expect(ok).to_be(false)
  return e
end

describe("tetra.util.json", function()
  it("writes numbers as checkpoints rely on", function()
    expect(json.encode(3)).to_be("3")
    expect(json.encode(-7)).to_be("-7")
    expect(json.encode(2^53 - 1)).to_be("9007199254740991")   -- the last integer written as one
    expect(json.encode(2^60)).to_be("1.152921504606847e+18")
    expect(json.encode(0.1)).to_be("0.10000000000000001")    -- 17 digits: the same double back
    expect(json.encode(-0.5)).to_be("-0.5")
    expect(json.encode(1e-8)).to_be("1e-08")
    expect(json.encode(0 / 0)).to_be("null")
    expect(json.encode(1 / 0)).to_be("null")
    expect(json.encode(-1 / 0)).to_be("null")
    expect(json.encode(1 / 3, { float = "%.9g" })).to_be("0.333333333")
    expect(json.encode(4, { float = "%.9g" })).to_be("4")
  end)

  it("reads every double it writes back exactly", function()
    local x = 0.7
    for _ = 1, 2000 do
      x = (x * 3.7 + 0.123456789) % 1
      for _, v in ipairs({ x, -x * 1e-300, x * 1e300, x * 2^40, 1 / (x + 1e-3) }) do
        local back = json.decode(json.encode(v))
        if back ~= v then error(("%.17g came back as %.17g"):format(v, back)) end
      end
    end
  end)

  it("writes objects with sorted keys, arrays in order, one line", function()
    expect(json.encode({ b = 1, a = {}, c = { 1, 2 }, d = { x = true, y = false } }))
      .to_be('{"a":[],"b":1,"c":[1,2],"d":{"x":true,"y":false}}')
    expect(json.encode({ z = 1, step = 2, a = 3, loss = 4 }, { first = { "step", "loss" } }))
      .to_be('{"step":2,"loss":4,"a":3,"z":1}')
    expect(json.encode({ n = 1, f = print, c = require("ffi").new("int", 1) })).to_be('{"n":1}')
    expect(json.encode({ 1, { 2, { 3 } } })).to_be("[1,[2,[3]]]")
  end)

  it("escapes quotes, backslashes and control characters", function()
    local s = 'a"b\\c\n\t\1/é'
    local text = json.encode(s)
    expect(text).to_be('"a\\"b\\\\c\\u000a\\u0009\\u0001/é"')
    expect(json.decode(text)).to_be(s)
    expect(json.decode('"\\n\\t\\r\\b\\f\\/\\u0041"')).to_be("\n\t\r\b\f/A")
    expect(json.decode('"\\u00e9"')).to_be("?")   -- no UTF-8 writer: outside ASCII is '?'
  end)

  it("round-trips state-like tables and keeps null apart from absent", function()
    local v = { a = 0.1, b = { 1, 2, 3 }, c = "x\"y\n", d = true, e = 2^60, f = {},
                g = { h = { -1.5e-7 } } }
    expect(json.decode(json.encode(v))).to_equal(v)
    local t = json.decode(' { "k" : [ 1 , null , "s" ] , "e" : { } } ')
    expect(t.k[2]).to_be(json.null)
    expect(t.k[3]).to_be("s")
    expect(t.e).to_equal({})
  end)

  it("names the offset of malformed input", function()
    expect(function() json.decode('{"a": }') end).to_error("offset 7: unexpected character")
    expect(function() json.decode("[1,2") end).to_error("offset 6: expected ',' or ']'")
    expect(function() json.decode('"abc') end).to_error("unterminated string")
    expect(function() json.decode("1 2") end).to_error("offset 3: trailing characters")
    expect(function() json.decode('{"a" 1}') end).to_error("expected ':'")
    expect(function() json.decode("") end).to_error("unexpected character")
  end)
end)

describe("tetra.util.errors", function()
  it("raises one user error type, with or without formatting", function()
    local e = raised(errors.raise, "checkpoint: %s has %d files", "ck", 3)
    expect(e.message).to_be("checkpoint: ck has 3 files")
    expect(e.user).to_be(true)
    expect(errors.is(e)).to_be(true)
    expect(errors.is(e, "config")).to_be(false)
    expect(tostring(e)).to_be("checkpoint: ck has 3 files")
    -- A message without arguments is taken as it is: a '%' in a file name stays.
    expect(raised(errors.raise, "cannot read 50%d.txt").message).to_be("cannot read 50%d.txt")
  end)

  it("tells kinds apart and plain tables from user errors", function()
    local c = errors.new("config error: x", "config")
    expect(errors.is(c, "config")).to_be(true)
    expect(errors.is(c)).to_be(true)
    expect(errors.is({ message = "x", user = true })).to_be(false)
    expect(errors.is("x")).to_be(false)
  end)

  it("reports a usage error as one line and exit code 2", function()
    local written, real = {}, io.stderr
    io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do written[#written + 1] = s end end,
                  flush = function() end }
    local ok, a, b = pcall(function()
      return errors.usage("tetra demo", "see tetra demo --help")("bad %s", "x"),
             errors.usage("tetra demo")("no %d% here")
    end)
    io.stderr = real
    expect(ok).to_be(true)
    expect(a).to_be(2)
    expect(b).to_be(2)
    expect(table.concat(written)).to_be("tetra demo: bad x (see tetra demo --help)\n" ..
                                        "tetra demo: no %d% here\n")
  end)

  it("is printed by the tetra binary as one line, without a traceback", function()
    local exe = assert(fs.self_exe())
    local p = io.popen("'" .. exe .. "' -e 'require(\"tetra.util.errors\").raise(\"bad key %s\", " ..
                       "\"x.y\")' 2>&1; echo \"rc=$?\"")
    local out = p:read("*a")
    p:close()
    expect(out).to_be("tetra: bad key x.y\nrc=1\n")
  end)
end)

describe("tetra.util.fs", function()
  it("makes, writes, reads, renames and removes", function()
    local d = tmpdir()
    fs.mkdir_p(d .. "/a/b/c", "test.dir")
    fs.mkdir_p(d .. "/a/b/c", "test.dir")   -- again: already there is fine
    expect(fs.is_dir(d .. "/a/b/c")).to_be(true)
    fs.write_file(d .. "/a/b/f.txt", "one\0two", "test")
    expect(fs.read_file(d .. "/a/b/f.txt")).to_be("one\0two")
    expect(fs.exists(d .. "/a/b/f.txt")).to_be(true)
    fs.rename(d .. "/a/b/f.txt", d .. "/a/g.txt", "test")
    expect(fs.exists(d .. "/a/b/f.txt")).to_be(false)
    expect(fs.listdir(d .. "/a")).to_equal({ "b", "g.txt" })
    fs.fsync(d .. "/a", "test")
    fs.remove_tree(d, "test")
    expect(fs.exists(d)).to_be(false)
    expect(fs.read_file(d .. "/a/g.txt")).to_be_nil()
  end)

  it("raises user errors that name the key", function()
    local d = tmpdir()
    fs.write_file(d .. "/file", "x", "test")
    local e = raised(fs.mkdir_p, d .. "/file/sub", "checkpoint.dir")
    expect(errors.is(e)).to_be(true)
    expect(e.message).to_match("^checkpoint%.dir: cannot create the folder .*/file/sub: ")
    expect(raised(fs.remove_tree, d .. "/missing", "checkpoint").message)
      .to_match("^checkpoint: cannot remove .*/missing: ")
    expect(raised(fs.write_file, d .. "/none/x", "y", "tetra convert").message)
      .to_match("^tetra convert: cannot write .*/none/x: ")
    expect(raised(fs.rename, d .. "/missing", d .. "/other", "checkpoint").message)
      .to_match("^checkpoint: cannot rename ")
    expect(raised(fs.fsync, d .. "/missing", "checkpoint").message)
      .to_match("^checkpoint: cannot open .*/missing to fsync: ")
    fs.remove_tree(d, "test")
  end)

  it("quotes a path as one shell word", function()
    local name = "it's a $HOME `x` \"y\""
    expect(fs.shell_quote(name)).to_be("'it'\\''s a $HOME `x` \"y\"'")
    local p = io.popen("printf '%s' " .. fs.shell_quote(name))
    expect(p:read("*a")).to_be(name)
    p:close()
    expect(fs.shell_quote(42)).to_be("'42'")
  end)

  it("finds this executable", function()
    local exe = fs.self_exe()
    expect(exe).to_match("tetra$")
    expect(fs.exists(exe)).to_be(true)
  end)
end)
