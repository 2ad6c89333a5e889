#!/bin/bash
# A file written by tetra reads back in Python's safetensors with the same values.
TETRA=${1:?usage: safetensors_python.sh /path/to/tetra}
PY=${PYTHON:-python3}
if ! "$PY" -c 'import numpy, safetensors.numpy' 2>/dev/null; then
  echo "no python safetensors in $PY (run tools/setup-python-refs)"
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$TETRA" -e '
local tetra = require("tetra")
local w = tetra.from_table({ { 1.5, -2, 3 }, { 4, 5.25, -6 } })
tetra.io.save(arg[1], { w = w, wt = w:transpose(0, 1), ids = tetra.arange(4),
                        half = w:to("f16") }, { epoch = "3" })' "$tmp/t.safetensors" || exit 1
"$PY" - "$tmp/t.safetensors" <<'PY' || exit 1
import sys, json, struct
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
w = np.array([[1.5, -2, 3], [4, 5.25, -6]], dtype=np.float32)
assert t["w"].dtype == np.float32 and np.array_equal(t["w"], w), t["w"]
assert np.array_equal(t["wt"], w.T), t["wt"]
assert t["half"].dtype == np.float16 and np.array_equal(t["half"], w.astype(np.float16))
assert np.array_equal(t["ids"], np.arange(4)), t["ids"]
with safe_open(sys.argv[1], "np") as f:
    assert f.metadata() == {"epoch": "3"}, f.metadata()
print("safetensors_python: python read", sorted(t))
PY
