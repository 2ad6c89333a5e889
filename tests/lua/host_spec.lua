-- The host layer: the FFI header loader, tetra.host helpers, safetensors from Lua, and
-- the spec runner's own matchers.
local ffi = require("ffi")
local tffi = require("tetra.ffi")
local host = require("tetra.host")
local tetra = require("tetra")

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d)
  return d
end

describe("tetra.ffi", function()
  it("declares each header once, in any order", function()
    tffi.cdef_header("tetra.h")
    tffi.cdef_header("tetra_amp.h")      -- includes tetra.h again: skipped
    tffi.cdef_header("engine/tetra_amp.h")
    tffi.cdef_header("tetra_io.h")
    expect(ffi.sizeof("tt_tensor") > 0).to_be(true)
    expect(ffi.sizeof("tt_loss_scaler") > 0).to_be(true)
  end)

  it("keeps the tt_tensor layout while freeing the plain field names", function()
    expect(ffi.offsetof("tt_tensor", "_shape") ~= nil).to_be(true)
    expect(ffi.offsetof("tt_tensor", "shape")).to_be_nil()
    local t = tetra.zeros(2, 5)
    expect(tonumber(t._shape[1])).to_be(5)
    expect(t:shape()).to_equal({ 2, 5 })
  end)

  it("check() raises the engine's message", function()
    local C = tffi.C
    local status = C.tt_view(tetra.zeros(2, 3), ffi.new("int64_t[1]", 5), 1, tetra.tensor.pout)
    expect(status).to_be(-1)
    expect(function() tffi.check(status) end).to_error("view")
    expect(tffi.has_symbol("tt_tensor_zeros")).to_be(true)
    expect(tffi.has_symbol("tt_no_such_function")).to_be(false)
  end)

  it("names a missing header and where it looked", function()
    expect(function() tffi.cdef_header("no_such_header.h") end).to_error("no_such_header.h not found")
  end)
end)

describe("tetra.host", function()
  it("lists directories sorted and tells directories from files", function()
    local d = tmpdir()
    for _, n in ipairs({ "b.lua", "a_spec.lua", "c" }) do io.open(d .. "/" .. n, "w"):close() end
    expect(host.listdir(d)).to_equal({ "a_spec.lua", "b.lua", "c" })
    expect(host.is_dir(d)).to_be(true)
    expect(host.is_dir(d .. "/b.lua")).to_be(false)
    local none, err = host.listdir(d .. "/missing")
    expect(none).to_be_nil()
    expect(err).to_match("No such file")
    os.execute("rm -rf " .. d)
  end)

  it("has a monotonic clock in seconds", function()
    local t0 = host.now()
    local x = 0
    for i = 1, 1e6 do x = x + i end
    local dt = host.now() - t0
    expect(dt >= 0 and dt < 5).to_be(true)
    expect(x).to_be(500000500000)
  end)

  it("knows the version and the library root", function()
    expect(host.version).to_match("^%d+%.%d+%.%d+")
    local f = io.open(host.root .. "/lua/tetra/init.lua")
    expect(f).to_be_truthy()
    f:close()
  end)
end)

describe("tetra.io (safetensors)", function()
  it("reads the file PyTorch wrote", function()
    local ts, meta = tetra.io.load(host.root .. "/tests/fixtures/safetensors_mixed.safetensors")
    expect(ts["f32.matrix"]:tolist()).to_equal({ { -1, -0.5, 0 }, { 0.5, 1, 1.5 } })
    expect(ts["bf16.vector"].dtype).to_be("bf16")
    expect(ts["bf16.vector"]:tolist()).to_equal({ 1, -2.5, 3.140625, 0.00099945068359375 })
    expect(ts["i64.ids"]:tolist()).to_equal({ 2 ^ 40 + 1, -5, 7 })
    expect(ts["scalar"]:item()).to_be(42.25)
    expect(meta.format).to_be("pt")
  end)

  it("round-trips tensors, dtypes and metadata", function()
    tetra.manual_seed(11)
    local w = tetra.randn(4, 3)
    local ids = tetra.arange(5)
    local path = os.tmpname() .. ".safetensors"
    tetra.io.save(path, { weight = w:transpose(0, 1), ids = ids, half = w:to("bf16") }, { step = 12 })
    local f = tetra.io.open(path)
    expect(f:names()).to_equal({ "half", "ids", "weight" })
    expect(f:info("weight")).to_equal({ dtype = "f32", shape = { 3, 4 } })
    expect(f:read("weight")).to_be_close(w:transpose(0, 1):tolist(), 0, 0)
    expect(f:read("ids"):tolist()).to_equal({ 0, 1, 2, 3, 4 })
    local into = tetra.zeros(4, 3)
    f:read_into("half", into)
    expect(into).to_be_close(w:to("bf16"):float(), 0, 0)
    expect(f:metadata()).to_equal({ step = "12" })
    expect(function() f:read("missing") end).to_error("no tensor 'missing'")
    f:close()
    os.remove(path)
  end)
end)

describe("tetra.spec matchers", function()
  it("report the worst element of a tensor comparison", function()
    local ok, err = pcall(function()
      expect(tetra.from_table({ 1, 2, 3.5 })).to_be_close({ 1, 2, 3 }, 1e-6)
    end)
    expect(ok).to_be(false)
    expect(err).to_match("element 3 is 3%.5, expected 3")
  end)

  it("negate with never and accept method-call syntax", function()
    expect(1).never.to_be(2)
    expect(5):to_be(5)
    expect(function() expect(1).never.to_be(1) end).to_error("not to be")
  end)
end)

describe("tetra.spec runner", function()
  -- A spec file of three tests whose second fails, run by the runner itself.
  local function run(opts)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write([[describe("d", function()
      it("one", function() end)
      it("two", function() expect(1).to_be(2) end)
      it("three", function() end)
    end)]])
    f:close()
    local text = {}
    local out = { write = function(_, ...) for _, s in ipairs({ ... }) do text[#text + 1] = s end end,
                  flush = function() end }
    local passed, failed = require("tetra.spec").run({ path }, out, opts)
    os.remove(path)
    return passed, failed, table.concat(text)
  end

  it("runs every test after a failure, or none when told to stop at it", function()
    local passed, failed, text = run({})
    expect({ passed, failed }).to_equal({ 2, 1 })
    expect(text).to_match("FAIL .*d > two")
    passed, failed, text = run({ stop_at_failure = true })
    expect({ passed, failed }).to_equal({ 1, 1 })
    expect(text).to_match("stopped at the first failure\n1 passed, 1 failed\n$")
  end)
end)
