-- Measures the data loader alone: pulls global batches as fast as it gives them and prints
-- one JSON line (tokens/s, per worker thread, S3 requests and bytes).
--   tetra -e 'dofile(arg[1])' tools/bench/data_loader.lua PATH TOKENIZER WORKERS SECONDS
local tetra = require("tetra")
local ffi = require("ffi")
local metrics = require("tetra.obs.metrics")
local a = {}
for i = 2, #arg do a[#a + 1] = arg[i] end
local path, tok, workers, seconds = a[1], a[2], tonumber(a[3] or "1"), tonumber(a[4] or "5")
local cfg = {
  model = { seq_len = 1024 },
  train = { batch_size = 8, seed = 1 },
  data = { input_path = path, tokenizer = tok, num_workers = workers, shuffle_buffer_size = 0,
           num_streams = 8, prefetch = 4 },
}
local loader = tetra.data.loader(cfg)
local tokens_per_batch = cfg.train.batch_size * cfg.model.seq_len
local t0 = metrics.now()
local x, y = loader:next_batch()   -- the first batch pays for opening the files
x:free(); y:free()
local t1, n = metrics.now(), 0
while metrics.now() - t1 < seconds do
  x, y = loader:next_batch()
  x:free(); y:free()
  n = n + 1
end
local dt = metrics.now() - t1
local req, retries, bytes = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
ffi.C.tt_s3_counters(req, retries, bytes)
print(string.format('{"source": "%s", "workers": %d, "first_batch_s": %.3f, "tokens_per_s": %.0f, ' ..
  '"tokens_per_s_per_worker": %.0f, "s3_requests": %d, "s3_bytes": %d}', path:match("^s3://") and "s3" or "local",
  workers, t1 - t0, n * tokens_per_batch / dt, n * tokens_per_batch / dt / workers,
  tonumber(req[0]), tonumber(bytes[0])))
