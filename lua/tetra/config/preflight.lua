-- tetra.config.preflight: what a configuration needs from the machine it starts on (its data,
-- tokenizer files, object-storage credentials, a GPU), found without reading or
-- allocating anything large. tetra.config asks it when a configuration cannot run here
-- anyway (the deployment guide's 64-process YAML started on one machine), so that one
-- run names everything that is missing, not only the process count.
--
--   preflight.problems(cfg)   -- an array of lines, "key: what is missing"
local host = require("tetra.host")

local M = {}

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return host.is_dir(path)
end

-- A shell glob's last component as a Lua pattern (*, ?, [...]).
local function glob_pattern(name)
  local p = name:gsub("[%^%$%(%)%%%.%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".")
  return "^" .. p .. "$"
end

-- Why `path` (a file, a glob whose wildcards are in the last component, or s3://) cannot
-- be read here, or nil.
local function missing_path(path)
  if path:match("^s3://") then
    local key, secret = os.getenv("AWS_ACCESS_KEY_ID"), os.getenv("AWS_SECRET_ACCESS_KEY")
    if not key or key == "" or not secret or secret == "" then
      return path .. ": no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; " ..
             "AWS_ENDPOINT_URL or data.s3_endpoint for a server other than AWS)"
    end
    return nil
  end
  local dir, name = path:match("^(.*)/([^/]*)$")
  if not dir then dir, name = ".", path end
  if dir == "" then dir = "/" end
  if not name:find("[%*%?%[]") then
    return not exists(path) and (path .. " does not exist") or nil
  end
  if not host.is_dir(dir) then return path .. ": no folder " .. dir end
  local pat = glob_pattern(name)
  for _, entry in ipairs(host.listdir(dir) or {}) do
    if entry:match(pat) then return nil end
  end
  return path .. " matches no file"
end

local function paths_of(v)
  if type(v) == "table" then return v end
  local out = {}
  for p in tostring(v):gmatch("[^,\n]+") do out[#out + 1] = p:match("^%s*(.-)%s*$") end
  return out
end

function M.problems(cfg)
  local out = {}
  local d = cfg.data or {}
  local function check(key, v)
    if v == nil or v == false or d.mock == true then return end
    for _, p in ipairs(paths_of(v)) do
      local why = missing_path(p)
      if why then out[#out + 1] = key .. ": " .. why end
    end
  end
  check("data.input_path", d.input_path)
  for i, ds in ipairs(d.datasets or {}) do
    if type(ds) == "table" then check(("data.datasets[%d].path"):format(i), ds.path) end
  end
  check("data.eval_path", d.eval_path)
  check("data.vocab_file", d.vocab_file)
  check("data.merges_file", d.merges_file)
  if d.tokenizer and d.tokenizer ~= "byte" then check("data.tokenizer", d.tokenizer) end
  local device = cfg.train and cfg.train.device or "cpu"
  if device:match("^cuda") then
    local tffi = require("tetra.ffi")
    local gpus = pcall(tffi.cdef_header, "tetra_cuda.h") and tffi.has_symbol("tt_cuda_device_count")
                 and tffi.C.tt_cuda_device_count() or 0
    if gpus < 1 then
      out[#out + 1] = "train.device: " .. device .. " but no GPU is visible on this machine"
    end
  end
  return out
end

return M
