-- tetra.repl's pieces that need no terminal: what counts as an incomplete chunk, the
-- last expression of a line, completion candidates, and how rank 0 groups the ranks'
-- answers. (The terminal itself is driven in tests/cli/repl_tty.sh and repl_mpi.sh.)
local repl = require("tetra.repl")
local tetra = require("tetra")

local function run(text, env)
  local fn, err = repl.compile(text, env or repl.new_env())
  if not fn then return nil, err end
  return fn()
end

describe("tetra.repl compile", function()
  it("prints the expression that ends a line of statements", function()
    local env = repl.new_env()
    local v = run("t = tetra.ones({2, 3}); t", env)
    expect(v:shape()).to_equal({ 2, 3 })
    expect(run("x = 4; y = x * 2; y + 1")).to_be(9)
    expect(run("a = {}; a.b = 1; a").b).to_be(1)
  end)

  it("waits for more only where the chunk stopped inside something", function()
    local env = repl.new_env()
    for _, partial in ipairs({ "for i = 1, 3 do", "f(", "t = {", "x = [[abc", "if x then",
                               "function f()" }) do
      local fn, err = repl.compile(partial, env)
      expect(fn).to_be_nil()
      expect(err).to_be("incomplete")
    end
    local fn, err = repl.compile("x = 1; x y", env)
    expect(fn).to_be_nil()
    expect(err).never.to_be("incomplete")
    expect(select(2, repl.compile("abc def", env))).never.to_be("incomplete")
    -- An expression where a statement was due: no next line completes it.
    fn, err = repl.compile("x = 1 y", env)
    expect(fn).to_be_nil()
    expect(err).to_be("stdin:1: '=' expected near '<eof>'")
  end)

  it("never splits a block at a semicolon inside it", function()
    local env = repl.new_env()
    run("n = 0; for i = 1, 3 do n = n + i; n = n end", env)
    expect(env.n).to_be(6)
  end)
end)

describe("tetra.repl completions", function()
  local env = repl.new_env()
  env.cfg = { model = { vocab_size = 256, dim = 64 }, train = { lr = 1 } }
  env.model = tetra.nn.Linear(4, 3)
  env.t = tetra.ones(2)

  it("completes globals and keywords", function()
    expect(repl.completions(env, "tet")).to_equal({ "tetra" })
    expect(repl.completions(env, "whi")).to_equal({ "while" })
  end)

  it("completes config keys and fields", function()
    expect(repl.completions(env, "cfg.model.vo")).to_equal({ "cfg.model.vocab_size" })
    expect(repl.completions(env, "cfg.")).to_equal({ "cfg.model", "cfg.train" })
    expect(repl.completions(env, "tetra.rand"))
      .to_equal({ "tetra.rand", "tetra.randint", "tetra.randn" })
  end)

  it("completes tensor and module methods after a colon", function()
    expect(repl.completions(env, "t:su")).to_equal({ "t:sub", "t:sum" })
    local found = false
    for _, c in ipairs(repl.completions(env, "model:")) do
      found = found or c == "model:parameters"
    end
    expect(found).to_be(true)
    expect(repl.completions(env, "nothing.here")).to_equal({})
  end)
end)

describe("tetra.repl answers of many ranks", function()
  it("writes rank sets as ranges", function()
    expect(repl.rank_ranges({ 0, 1, 2, 3 })).to_be("0-3")
    expect(repl.rank_ranges({ 0, 2 })).to_be("0,2")
    expect(repl.rank_ranges({ 1, 2, 5, 6, 7 })).to_be("1-2,5-7")
  end)

  it("shows identical answers once and different ones per rank", function()
    local shown = repl.group_answers({ "2.3145\n", "2.3145\n", "error: boom\n", "2.3145\n" }, 4)
    expect(shown).to_be("[0-1,3] 2.3145\n[2] error: boom")
    expect(repl.group_answers({ "a\nb\n", nil, "a\nb\n" }, 3)).to_be("[0,2] a\n[0,2] b")
    expect(repl.group_answers({ "", "" }, 2)).to_be("")
  end)
end)
