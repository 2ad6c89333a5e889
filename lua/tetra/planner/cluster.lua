-- tetra.planner.cluster: the devices and links the planner prices a layout on (presets
-- with their sources, and overrides).
local errors = require("tetra.util.errors")

local M = {}

-- A device: peak_flops (dense, the precision's), matmul and attention kernel rates as
-- fractions of it, mem_bw (bytes/s for elementwise kernels), mem_bytes, and `sustained`
-- (the fraction of those kernel rates a whole training step reaches); elementwise =
-- "eager" when every elementwise op is its own kernel (eager_block_bytes), else fused
-- kernels are assumed (one read and one write an op). Links: intra_bw
-- (bytes/s per device and direction inside a node), inter_bw (per device, between
-- nodes), latency_s per collective step, inter_latency_s per step between nodes (when
-- unset, latency_s: no preset tells them apart; `tetra plan --inter-latency-us` does).
-- Optimizer offload (parallel.offload_optimizer): offload_bw (bytes/s per device each way
-- between the device and its host) and host_bw (the host memory bandwidth one device's
-- share of the CPU update gets); the cpu cluster has neither (its mem_bw: host to host).
-- GPU nodes: PCIe 5.0 x16 at 64 GB/s per direction (PCI-SIG), taken as 50 sustained; a
-- 2-socket host's ~400 GB/s of DDR5 shared by 8 GPUs, 50 GB/s each (estimates).
-- Sources: H100 SXM: NVIDIA H100 datasheet (989 TFLOP/s dense BF16, 1,979 FP8, 3.35 TB/s
-- HBM3, 80 GB, NVLink 4 at 900 GB/s both directions); H200: NVIDIA H200 datasheet
-- (same compute, 141 GB HBM3e at 4.8 TB/s). 400 Gb/s InfiniBand per GPU = 50 GB/s.
-- matmul 0.80: cuBLAS BF16 GEMMs measured ~790 TFLOP/s on an H200 (docs/planner.md);
-- attention 0.55: FlashAttention-3 / cuDNN forward+backward at head dim 128 (Shah et al.
-- 2024, "FlashAttention-3", arXiv:2407.08608, fig. 5-6: ~500-600 TFLOP/s).
-- sustained 0.636: calibrated once, on Megatron-LM's 96-GPU GPT-3 175B row (47% MFU);
-- every other published row is a prediction (docs/planner.md).
-- cpu: this machine (2 Zen 4 cores, one rank per core, fp32, MPI over shared memory):
-- peak 105 GFLOP/s, one core's OpenBLAS sgemm (DESIGN.md: ~210 on 2 cores); attention
-- 0.6 of it (tools/bench/engine's causal attention forward+backward at 0.43-0.70);
-- links 12 us and 1.7 GB/s, an all-reduce between 2 ranks (tools/bench/plan_comm.lua,
-- 2026-12-01 05:44 UTC); sustained 1.0: the README's quiet-machine one-process, one-thread
-- run of the layouts benchmark model (3,059 tokens/s). mem_bw 8 GB/s per core is an
-- estimate. A shared machine runs slower than all of these: tools/bench/plan.sh and
-- `tetra sweep --calibrate` measure the links and the sustained fraction first.
M.clusters = {
  h100 = { name = "H100 SXM nodes (8 GPUs, NVLink 4, 400 Gb/s InfiniBand per GPU)",
           devices_per_node = 8, nodes = 1, peak_flops = 989e12, fp8_flops = 1979e12,
           matmul = 0.80, attention = 0.55, mem_bw = 3.35e12, mem_bytes = 80e9,
           intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636, offload_bw = 50e9, host_bw = 50e9,
           precision = "bf16" },
  h200 = { name = "H200 SXM nodes (8 GPUs, NVLink 4, 400 Gb/s InfiniBand per GPU)",
           devices_per_node = 8, nodes = 1, peak_flops = 989e12, fp8_flops = 1979e12,
           matmul = 0.80, attention = 0.55, mem_bw = 4.8e12, mem_bytes = 141e9,
           intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636, offload_bw = 50e9, host_bw = 50e9,
           precision = "bf16" },
  -- torchtitan's benchmark machines (pytorch/torchtitan
  -- benchmarks/llama3_h100_202412_torchtitan.md, formerly docs/performance.md): Grand
  -- Teton hosts of 8 H100 with 96 GB HBM2e at 2.4 TB/s, 400 Gb/s per GPU between hosts,
  -- "the default 500W power limit". Its footnote: "the actual peak TFLOPs number is
  -- between SXM and NVL, and we don't know its exact value": between the H100 SXM's 989
  -- and the H100 NVL's 835 dense BF16 TFLOP/s (NVIDIA H100 datasheet: 1,671 with
  -- sparsity); the planner takes the middle, 912 (either end moves a prediction 8%).
  h100_500w = { name = "H100 HBM2e 96 GB at 500 W (torchtitan's Grand Teton nodes)",
                devices_per_node = 8, nodes = 1, peak_flops = 912e12, fp8_flops = 1824e12,
                matmul = 0.80, attention = 0.55, mem_bw = 2.4e12, mem_bytes = 96e9,
                intra_bw = 450e9, inter_bw = 50e9, latency_s = 10e-6, sustained = 0.636, offload_bw = 50e9, host_bw = 50e9,
                precision = "bf16" },
  cpu = { name = "this machine: 2 CPU cores, one rank per core (MPI shared memory)",
          devices_per_node = 2, nodes = 1, peak_flops = 105e9, matmul = 1.0,
          attention = 0.6, mem_bw = 8e9, mem_bytes = 12e9, intra_bw = 1.7e9,
          inter_bw = 1.7e9, latency_s = 12e-6, sustained = 1.0, precision = "fp32",
          host_is_device = true },
}

-- The preset `name` with `over` (any of its fields) applied; one line if unknown.
function M.cluster(name, over)
  local base = M.clusters[name]
  if not base then
    local names = {}
    for k in pairs(M.clusters) do names[#names + 1] = k end
    table.sort(names)
    errors.raise("unknown cluster '%s': choose one of %s", tostring(name),
                 table.concat(names, ", "))
  end
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  c.sync_wait = c.sync_wait or 0   -- no preset carries one: a measured figure (--sync-wait)
  c.inter_latency_s = c.inter_latency_s or c.latency_s
  c.devices = c.devices_per_node * c.nodes
  return c
end

return M
