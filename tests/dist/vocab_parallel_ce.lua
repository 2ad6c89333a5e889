-- Worker for vocab_parallel_ce.sh (2 or 3 ranks, one tp group): the vocab-parallel
-- cross-entropy of this rank's columns of a logits matrix (the same on every rank, from
-- the same seed) against a float64 reference of the plain cross-entropy of the whole
-- matrix: the loss, and the gradient of this rank's columns (ignored rows get none; large
-- logits must not overflow). Then a target outside the vocabulary must be an error.
-- Exits non-zero (aborting the job) on the first mismatch.
local tetra = require("tetra")
local tp = tetra.parallel.tensor
local size = tetra.dist.world_size()
local mesh = tetra.dist.init({ parallel = { tensor_parallel_size = size },
                               dist = { timeout_s = 60 } })
local g = mesh.tp
local r = g.rank
local function expect(cond, what)
  if not cond then error(string.format("rank %d: %s", r, what), 0) end
end

local N, Vl, IGNORE = 7, 5, -100
local V = Vl * size
tetra.manual_seed(11)
local full = (tetra.randn({ N, V }) * 3.0):tolist()
full[2][V] = full[2][V] + 60.0                      -- a large logit (overflow check)
local targets = {}
for n = 1, N do targets[n] = (n * 5 + 3) % V end
targets[4] = IGNORE                                 -- an ignored row
targets[6] = V - 1                                  -- owned by the last rank

-- float64 reference: loss = mean over kept rows of logsumexp(x) - x[t];
-- d loss / d x[n][j] = (softmax(x)[j] - [j == t]) / count.
local count, total, ref_grad = 0, 0.0, {}
for n = 1, N do
  ref_grad[n] = {}
  for j = 1, V do ref_grad[n][j] = 0.0 end
  if targets[n] ~= IGNORE then
    count = count + 1
    local m = -math.huge
    for j = 1, V do m = math.max(m, full[n][j]) end
    local s = 0.0
    for j = 1, V do s = s + math.exp(full[n][j] - m) end
    local lse = m + math.log(s)
    total = total + lse - full[n][targets[n] + 1]
    for j = 1, V do ref_grad[n][j] = math.exp(full[n][j] - lse) end
    ref_grad[n][targets[n] + 1] = ref_grad[n][targets[n] + 1] - 1.0
  end
end
local ref_loss = total / count

local mine = {}
for n = 1, N do
  mine[n] = {}
  for j = 1, Vl do mine[n][j] = full[n][r * Vl + j] end
end
local x = tetra.from_table(mine):requires_grad_()
local t = tetra.from_table(targets, "i64")
local loss = tp.vocab_parallel_cross_entropy(x, t, g, r * Vl, IGNORE)
local got = loss:item()
expect(math.abs(got - ref_loss) <= 2e-6 * math.abs(ref_loss),
       string.format("loss %.9g, reference %.9g", got, ref_loss))
-- The plain cross-entropy of the whole matrix agrees as well.
local plain = tetra.cross_entropy(tetra.from_table(full), t, IGNORE):item()
expect(math.abs(got - plain) <= 2e-6 * math.abs(plain),
       string.format("loss %.9g, plain cross_entropy %.9g", got, plain))
loss:backward()
local grad = x.grad:tolist()
for n = 1, N do
  for j = 1, Vl do
    local want = ref_grad[n][r * Vl + j] / count
    expect(math.abs(grad[n][j] - want) <= 1e-6,
           string.format("grad[%d][%d] = %.9g, reference %.9g", n, j, grad[n][j], want))
  end
end

-- A target no rank owns is an error on every rank (the owner count is all-reduced).
targets[1] = V
local ok, err = pcall(tp.vocab_parallel_cross_entropy, x, tetra.from_table(targets, "i64"),
                      g, r * Vl, IGNORE)
expect(not ok and tostring(err):find("outside the vocabulary", 1, true),
       "target outside the vocabulary: " .. tostring(err))
if r == 0 then print(string.format("vocab_parallel_ce on %d ranks: loss %.9g (reference %.9g)",
                                   size, got, ref_loss)) end
