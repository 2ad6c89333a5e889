-- Worker for tp_fused.sh (2 ranks, tensor parallel 2, bf16 or TT_PRECISION): the
-- projections that read one input run behind one gather of that input (tetra.nn.linears
-- through the column-parallel layers' group_input), in bf16 as one GEMM on each rank's
-- column slices: two grouped GEMMs per block (q/k/v, w1 | w3), and in fp32 too one
-- gather (copy_to_group, or sp_gather under sequence parallelism) in front of each group
-- instead of one per projection (fp8: one per projection, tetra.nn.linears says why);
-- and steps that run clean. Exits non-zero on the first mismatch.
local tetra = require("tetra")
local C = require("tetra.ffi").C
local sp = os.getenv("TT_SP") == "1"
local precision = os.getenv("TT_PRECISION") or "bf16"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local tiny = dofile(here .. "/../../recipes/tiny.lua")
local sets = { "parallel.tensor_parallel_size=2", "train.precision=" .. precision,
               "parallel.sequence_parallel=" .. tostring(sp) }
local cfg = require("tetra.config").build({ defaults = tiny.defaults, sets = sets })
cfg.log.progress = false
local env = tiny.setup(cfg)
local function fail(msg) error(string.format("rank %d (sp %s): %s", env.rank, tostring(sp), msg), 0) end

C.tt_tape_clear()
local ids = tetra.randint(0, cfg.model.vocab_size, 2, cfg.model.seq_len)
local logits = env.model(ids)
local count = tetra.nn.functional.tape_ops()
C.tt_tape_clear()
logits:free()
local L = cfg.model.n_layers
local gather = sp and "sp_gather" or "copy_to_group"
local gathers = precision == "fp8" and 5 * L + 1 or 2 * L + 1
local grouped = precision == "bf16" and 2 * L or 0   -- fp32: a GEMM per projection
if (count.tt_linear_lowp_group or 0) ~= grouped then
  fail(string.format("%d grouped GEMMs, want %d", count.tt_linear_lowp_group or 0, grouped))
end
-- per block: one gather before q/k/v, one before w1 | w3; one more for the head
if (count[gather] or 0) ~= gathers then
  fail(string.format("%d %s nodes, want %d", count[gather] or 0, gather, gathers))
end
local first, last
for i = 1, 3 do
  local r = env.step()
  if r.skipped or r.loss ~= r.loss or not (r.grad_norm > 0) then
    fail(string.format("step %d: loss %s, grad_norm %s, skipped %s", i, tostring(r.loss),
                       tostring(r.grad_norm), tostring(r.skipped)))
  end
  first, last = first or r.loss, r.loss
end
if env.rank == 0 then
  print(string.format("ok: %s, sp %s, %d grouped GEMMs, %d %s, loss %.4f -> %.4f", precision,
                      tostring(sp), count.tt_linear_lowp_group or 0, count[gather], gather,
                      first, last))
end
