-- tetra.repl.channel: how the ranks of an SPMD REPL session (tetra.repl under mpirun)
-- talk. Rank 0 sends every command (a kind and a text) to all ranks and gathers what each
-- printed; rank 0 then shows identical answers once, labelled with their ranks. The
-- channel is a group of its own, split from the world, so its messages never meet the
-- recipe's. Every wait polls instead of blocking under the watchdog: a rank may sit at the
-- prompt, or run train_steps(10000), far longer than dist.timeout_s.
--
--   local ch = channel.new()                 -- every rank, once
--   kind, text = ch:broadcast(kind, text)    -- rank 0's command on every rank
--   texts = ch:gather(text, on_poll)         -- every rank's answer, on rank 0
--   ch:begin_line() ... ch:agree_interrupt() ... ch:end_line()   -- Ctrl-C for one line
--   ch:select(spec, env)                     -- "%on 1,3" / "%on tp=0" / "%on all"
--   channel.group_answers(texts, size)       -- "[0-3] 2.3145"
local host = require("tetra.host")

local M = {}
M.CMD_RUN, M.CMD_ON, M.CMD_EXIT = 1, 2, 3
local TAG_INTERRUPT = 7301

local Channel = {}
Channel.__index = Channel

local function wait_polling(h, on_poll)
  local pause = 0.0002
  while not h:test() do
    if on_poll then on_poll() end
    host.sleep(pause)
    pause = math.min(pause * 2, 0.005)
  end
  return h:wait()
end

local function ints_from_string(s, n)
  local T = require("tetra.tensor")
  local t = T.zeros({ math.max(n, 1) }, "i32")
  local p = t:data_ptr("int32_t *")
  for i = 1, #s do p[i - 1] = s:byte(i) end
  return t
end

local function string_from_ints(t, offset, len)
  local ffi = require("ffi")
  local p = t:data_ptr("int32_t *")
  local buf = ffi.new("char[?]", math.max(len, 1))
  for i = 0, len - 1 do buf[i] = p[offset + i] end
  return ffi.string(buf, len)
end

function M.new()
  local dist = require("tetra.dist")
  local world = dist.world()
  local g = world:split(0, world.rank, "repl", { host_only = true })
  local ch = setmetatable({ g = g, rank = g.rank, size = g.size, selected = true,
                            sel_group = g, on_spec = "all", members = {}, sent = {} },
                          Channel)
  for r = 1, ch.size do ch.members[r] = true end   -- rank 0's view of who runs lines
  return ch
end

-- Rank 0's (kind, text) on every rank.
function Channel:broadcast(kind, text)
  local T = require("tetra.tensor")
  local head = T.zeros({ 2 }, "i32")
  local hp = head:data_ptr("int32_t *")
  if self.rank == 0 then hp[0], hp[1] = kind, #text end
  wait_polling(self.g:broadcast_async(head, 0))
  kind = hp[0]
  local len = hp[1]
  local body = self.rank == 0 and ints_from_string(text, len)
               or T.zeros({ math.max(len, 1) }, "i32")
  wait_polling(self.g:broadcast_async(body, 0))
  return kind, string_from_ints(body, 0, len)
end

-- Every rank's text, as an array indexed by rank + 1, on rank 0 (nil elsewhere).
function Channel:gather(text, on_poll)
  local T = require("tetra.tensor")
  local len = T.full({ 1 }, #text, { dtype = "i32" })
  local lens = wait_polling(self.g:all_gather_async(len, 0), on_poll)
  local lp = lens:data_ptr("int32_t *")
  local max = 1
  for r = 0, self.size - 1 do max = math.max(max, lp[r]) end
  local all = wait_polling(self.g:all_gather_async(ints_from_string(text, max), 0), on_poll)
  if self.rank ~= 0 then return nil end
  local out = {}
  for r = 0, self.size - 1 do out[r + 1] = string_from_ints(all, r * max, lp[r]) end
  return out
end

-- Before a line runs: the ranks other than 0 that run it listen for rank 0's interrupt
-- token (exactly one per line: 1 when Ctrl-C came while rank 0 was only waiting, 0 once
-- the line is over).
function Channel:begin_line()
  self.token_handle = nil
  self.sent = {}
  if self.rank ~= 0 and self.selected then
    local T = require("tetra.tensor")
    self.token = T.zeros({ 1 }, "i32")
    self.token_handle = self.g:recv_async(self.token, 0, TAG_INTERRUPT)
  end
  self.interrupted_seen = false
end

-- Called by the ranks running the line, all at the same point: whether any of them saw
-- Ctrl-C (rank 0's flag, or rank 0's token), agreed over the running ranks.
function Channel:agree_interrupt()
  local seen = 0
  if self.rank == 0 then
    if host.interrupted(true) then seen = 1 end
  elseif self.token_handle and not self.interrupted_seen and self.token_handle:test() then
    self.interrupted_seen = true
    if self.token:data_ptr("int32_t *")[0] ~= 0 then seen = 1 end
  end
  local T = require("tetra.tensor")
  local flag = T.full({ 1 }, seen, { dtype = "i32" })
  self.sel_group:all_reduce(flag, "max")
  return flag:data_ptr("int32_t *")[0] ~= 0
end

-- Rank 0, waiting while other ranks run the line: Ctrl-C goes to them as a token.
function Channel:send_interrupt()
  local T = require("tetra.tensor")
  for r = 1, self.size - 1 do
    if self.members[r + 1] and not self.sent[r] then
      self.sent[r] = true
      wait_polling(self.g:send_async(T.ones({ 1 }, "i32"), r, TAG_INTERRUPT))
    end
  end
end

-- After the line: rank 0 sends the tokens not sent yet; the others take theirs.
function Channel:end_line()
  local T = require("tetra.tensor")
  if self.rank == 0 then
    for r = 1, self.size - 1 do
      if self.members[r + 1] and not self.sent[r] then
        wait_polling(self.g:send_async(T.zeros({ 1 }, "i32"), r, TAG_INTERRUPT))
      end
    end
  elseif self.token_handle then
    wait_polling(self.token_handle)
    self.token_handle = nil
  end
end

-- "1,3", "0-2", "tp=0", "tp=0,dp=1" or "all" -> whether this rank is chosen, or nil +
-- why the spec is wrong (every rank finds the same problem).
function M.on_spec_selects(spec, rank, size, mesh)
  if spec == "all" then return true end
  if spec:match("^[%d%s,%-]+$") then
    local chosen = false
    for part in spec:gmatch("[^,]+") do
      local a, b = part:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
      if not a then a = part:match("^%s*(%d+)%s*$"); b = a end
      if not a then return nil, ("%%on: '%s' is not a rank or a range a-b"):format(part) end
      a, b = tonumber(a), tonumber(b)
      if b >= size or a > b then
        return nil, ("%%on: ranks %s are not within 0-%d"):format(part, size - 1)
      end
      if rank >= a and rank <= b then chosen = true end
    end
    return chosen
  end
  local chosen = true
  for part in spec:gmatch("[^,]+") do
    local dim, val = part:match("^%s*(%a+)%s*=%s*(%d+)%s*$")
    if not dim then
      return nil, ("%%on: '%s' is neither ranks (1,3 or 0-2) nor dim=index (tp=0)"):format(part)
    end
    if not (dim == "tp" or dim == "cp" or dim == "dp" or dim == "pp") then
      return nil, ("%%on: unknown dimension '%s' (tp, cp, dp or pp)"):format(dim)
    end
    if not (mesh and mesh.coords) then
      return nil, "%on " .. part .. ": this session has no mesh (start with tetra -i RECIPE)"
    end
    if tonumber(val) >= mesh.layout[dim] then
      return nil, ("%%on: %s=%s but the layout has %s=%d"):format(dim, val, dim, mesh.layout[dim])
    end
    if mesh.coords[dim] ~= tonumber(val) then chosen = false end
  end
  return chosen
end

-- Every rank applies a checked spec: the chosen ones form the group that agrees on
-- Ctrl-C; rank 0 learns who they are.
function Channel:select(spec, env)
  local chosen = M.on_spec_selects(spec, self.rank, self.size, rawget(env, "mesh"))
  self.selected = chosen and true or false
  self.on_spec = spec
  self.sel_group = spec == "all" and self.g
                   or self.g:split(self.selected and 0 or 1, self.rank, "repl-on",
                                   { host_only = true })
  local all = self:gather(self.selected and "1" or "0")
  if all then
    self.members = {}
    for r = 1, self.size do self.members[r] = all[r] == "1" end
  end
end

-- "0-3", "0,2", "1-2,5" for a sorted array of ranks.
function M.rank_ranges(ranks)
  local parts, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    parts[#parts + 1] = i == j and tostring(ranks[i]) or (ranks[i] .. "-" .. ranks[j])
    i = j + 1
  end
  return table.concat(parts, ",")
end

-- Rank 0's view of one line's answers: identical texts once, labelled with their ranks.
-- texts[r + 1] is rank r's text; nil for a rank that did not run the line.
function M.group_answers(texts, size)
  local order, ranks_of = {}, {}
  for r = 0, size - 1 do
    local t = texts[r + 1]
    if t and t ~= "" then
      if not ranks_of[t] then ranks_of[t] = {}; order[#order + 1] = t end
      table.insert(ranks_of[t], r)
    end
  end
  local out = {}
  for _, t in ipairs(order) do
    local label = "[" .. M.rank_ranges(ranks_of[t]) .. "] "
    for line in t:gmatch("([^\n]*)\n?") do
      if line ~= "" then out[#out + 1] = label .. line end
    end
  end
  return table.concat(out, "\n")
end

return M

