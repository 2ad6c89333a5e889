-- tetra.util.fs: the file helpers the Lua side shares. A helper that can fail on
-- something the user controls (a folder it may not write, a full disk) raises a user
-- error (tetra.util.errors) that starts with `who`, the key or command that named the
-- path ("checkpoint.dir", "tetra plot").
--
--   fs.exists(path)                  a file or a folder is there
--   fs.read_file(path)               the whole file as a string, or nil
--   fs.write_file(path, data, who)   written and fsynced
--   fs.fsync(path, who)              a file's or a folder's writes made durable
--   fs.rename(from, to, who)         atomic within one file system
--   fs.mkdir_p(path, who)            the folder and its parents
--   fs.remove_tree(path, who)        a file, or a folder and everything in it
--   fs.listdir(path), fs.is_dir(path)  the host's (engine/host), sorted names
--   fs.self_exe()                    this executable's path, or nil
--   fs.shell_quote(path)             a path (or any string) as one word of a shell command
local ffi = require("ffi")
local host = require("tetra.host")
local raise = require("tetra.util.errors").raise

local M = { listdir = host.listdir, is_dir = host.is_dir }

-- Private names, so they cannot clash with another module's cdef of the same functions.
ffi.cdef [[
int tt_fs_open(const char *path, int flags, ...) __asm__("open");
int tt_fs_fsync(int fd) __asm__("fsync");
int tt_fs_close(int fd) __asm__("close");
int tt_fs_mkdir(const char *path, unsigned int mode) __asm__("mkdir");
int tt_fs_access(const char *path, int mode) __asm__("access");
char *tt_fs_strerror(int errnum) __asm__("strerror");
long tt_fs_readlink(const char *path, char *buf, size_t size) __asm__("readlink");
]]
local C = ffi.C

local O_RDONLY, EEXIST, MODE_0755, W_OK_X_OK = 0, 17, 493, 3

local function errno_text() return ffi.string(C.tt_fs_strerror(ffi.errno())) end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close(); return true end
  return host.is_dir(path)
end

function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- A folder is fsynced too: that makes the names created or renamed in it durable.
function M.fsync(path, who)
  local fd = C.tt_fs_open(path, O_RDONLY)
  if fd < 0 then raise("%s: cannot open %s to fsync: %s", who, path, errno_text()) end
  local rc = C.tt_fs_fsync(fd)
  C.tt_fs_close(fd)
  if rc ~= 0 then raise("%s: fsync %s: %s", who, path, errno_text()) end
end

function M.write_file(path, data, who)
  local f, err = io.open(path, "wb")
  if not f then raise("%s: cannot write %s: %s", who, path, tostring(err)) end
  local ok, werr = f:write(data)
  f:close()
  if not ok then raise("%s: cannot write %s: %s", who, path, tostring(werr)) end
  M.fsync(path, who)
end

function M.rename(from, to, who)
  local ok, err = os.rename(from, to)
  if not ok then raise("%s: cannot rename %s to %s: %s", who, from, to, tostring(err)) end
end

function M.mkdir_p(path, who)
  local prefix = path:sub(1, 1) == "/" and "" or "."
  for part in path:gmatch("[^/]+") do
    prefix = prefix .. "/" .. part
    if C.tt_fs_mkdir(prefix, MODE_0755) ~= 0 and ffi.errno() ~= EEXIST then
      raise("%s: cannot create the folder %s: %s", who, prefix, errno_text())
    end
  end
end

-- A folder this process can create files in, made if missing (a run's output folder,
-- checked at its start rather than when it first writes there).
function M.writable_dir(path, who)
  M.mkdir_p(path, who)
  if C.tt_fs_access(path, W_OK_X_OK) ~= 0 then
    raise("%s: cannot write in the folder %s: %s", who, path, errno_text())
  end
end

function M.remove_tree(path, who)
  if host.is_dir(path) then
    for _, name in ipairs(host.listdir(path) or {}) do M.remove_tree(path .. "/" .. name, who) end
  end
  local ok, err = os.remove(path)
  if not ok then raise("%s: cannot remove %s: %s", who, path, tostring(err)) end
end

function M.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.self_exe()
  local buf = ffi.new("char[4096]")
  local n = tonumber(C.tt_fs_readlink("/proc/self/exe", buf, 4095))
  if n <= 0 then return nil end
  return ffi.string(buf, n)
end

return M
