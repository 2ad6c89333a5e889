-- Prints the first N batches of a data loader, one line per batch (the token ids), so two
-- sources can be compared: tetra -e "dofile(arg[1])" batches.lua PATH N [section.key=value ...]
local tetra = require("tetra")
local config = require("tetra.config")
local a = {}
for i = 2, #arg do a[#a + 1] = arg[i] end   -- arg[1] is this file (tetra -e "dofile(arg[1])" ...)
local path, n = a[1], tonumber(a[2] or "4")
local cfg = {
  model = { seq_len = 16 },
  train = { batch_size = 4, seed = 7 },
  data = { input_path = path, num_workers = 2, shuffle_buffer_size = 0, tokenizer = "byte" },
}
for i = 3, #a do
  local sec, key, val = a[i]:match("^([%w_]+)%.([%w_]+)=(.*)$")
  cfg[sec] = cfg[sec] or {}
  cfg[sec][key] = config.parse_value(val)
end
local loader = tetra.data.loader(cfg)
for b = 1, n do
  local x = loader:next_batch()
  local t = x:tolist()
  local flat = {}
  local function walk(v) if type(v) == "table" then for _, e in ipairs(v) do walk(e) end else flat[#flat + 1] = v end end
  walk(t)
  print(table.concat(flat, " "))
end
