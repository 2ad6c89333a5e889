# Sourced by the GPU test scripts: need_gpus TETRA N [SYMBOL...] exits 77 (ctest's skip)
# with one line saying why unless TETRA was built with CUDA (tetra_cuda.h's functions and
# each SYMBOL, a C function the test calls, are there) and sees N or more CUDA devices.
need_gpus() {
  local tetra="$1" n="$2"; shift 2
  TETRA_NEED_GPUS="$n" "$tetra" -e '
    local f = require("tetra.ffi")
    local ok = pcall(f.cdef_header, "tetra_cuda.h") and f.has_symbol("tt_cuda_device_count")
    for _, s in ipairs(arg) do
      if s:match("lowp") then ok = ok and pcall(f.cdef_header, "cuda/tetra_cuda_lowp.h") end
      ok = ok and f.has_symbol(s)
    end
    if not ok then print("SKIP: this tetra was built without CUDA"); os.exit(77) end
    local have, want = f.C.tt_cuda_device_count(), tonumber(os.getenv("TETRA_NEED_GPUS"))
    if have < want then
      print(want == 1 and "SKIP: no CUDA device" or
            ("SKIP: needs " .. want .. " GPUs, " .. have .. " visible"))
      os.exit(77)
    end' "$@" || exit $?
}
