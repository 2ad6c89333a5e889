#!/usr/bin/env bash
# tetra sweep --chart FILE.png --repeat 2: two one-rank layouts of a small Llama, each
# run twice in interleaved rounds (each row the median of its rounds), become a valid
# 960x1080 PNG (three panels of measured and predicted bars: tokens/s, rank 0's peak MiB,
# exposed communication), and the data file gnuplot draws (FILE.dat) holds the very
# numbers `tetra sweep --json` reports, row by row. A chart that cannot be drawn (no
# gnuplot, a name not ending in .png, a folder that does not exist) is one line and exit
# 2 before any layout runs.
# Usage: bash sweep_chart.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
py="${PYTHON:-python3}"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! command -v gnuplot >/dev/null; then
  [ "${CI:-}" = true ] && fail "no gnuplot (CI=true; tools/setup installs gnuplot-nox)"
  echo "SKIP: no gnuplot"; exit 77
fi
if ! command -v mpirun >/dev/null; then echo "SKIP: no mpirun"; exit 77; fi
cd "$tmp"
model=(--set model.dim=128 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_hidden=384 --set model.vocab_size=2048 --set model.seq_len=64 --batch 8)

"$tetra" sweep "${model[@]}" --steps 3 --json --layout dp=1,mb=4 --layout dp=1,mb=8 \
  --chart out/sweep.png >sweep.json 2>sweep.err && fail "a missing folder was accepted"
mkdir out
timeout -k 10 100 "$tetra" sweep "${model[@]}" --steps 3 --repeat 2 --json --layout dp=1,mb=4 \
  --layout dp=1,mb=8 --chart out/sweep.png >sweep.json 2>sweep.err ||
  fail "tetra sweep --chart: $(tail -3 sweep.err)"
# --repeat 2: the list runs twice, layout after layout in each round.
order=$(sed -n 's/^# running \([^ ]*\) on .*/\1/p' sweep.err | tr '\n' ' ')
[ "$order" = "01_dp1_tp1_pp1_cp1_z0_mb4_-_r1 02_dp1_tp1_pp1_cp1_z0_mb8_-_r1 01_dp1_tp1_pp1_cp1_z0_mb4_-_r2 02_dp1_tp1_pp1_cp1_z0_mb8_-_r2 " ] ||
  fail "runs in the order $order"
[ -f out/sweep.png ] && [ -f out/sweep.dat ] && [ -f out/sweep.gp ] ||
  fail "no out/sweep.png, .dat and .gp: $(ls out)"
grep -q "^# chart: out/sweep.png$" sweep.err || fail "the chart's name is not reported"

"$py" - out/sweep.png out/sweep.dat sweep.json <<'PY' || exit 1
import json, shlex, struct, sys, zlib
png, dat, js = sys.argv[1:]
def fail(msg):
    print("FAIL:", msg); sys.exit(1)
b = open(png, "rb").read()
if b[:8] != b"\x89PNG\r\n\x1a\n": fail("no PNG signature")
pos, kinds = 8, []
while pos < len(b):
    n, kind = struct.unpack(">I4s", b[pos:pos + 8])
    data = b[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", b[pos + 8 + n:pos + 12 + n])
    if zlib.crc32(kind + data) != crc: fail("bad CRC in " + kind.decode())
    if kind == b"IHDR" and struct.unpack(">II", data[:8]) != (960, 1080):
        fail(f"{struct.unpack('>II', data[:8])}, want 960 x 1080")
    kinds.append(kind)
    pos += 12 + n
if kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds: fail(f"chunks {kinds}")
if len(b) < 20000: fail(f"{len(b)} bytes: an empty chart?")

rows = json.load(open(js))
lines = [shlex.split(l) for l in open(dat) if not l.startswith("#")]
if len(lines) != len(rows) or len(rows) != 2: fail(f"{len(lines)} data rows, {len(rows)} runs")
want_labels = ["1 rank mb4", "1 rank mb8"]
for i, (cells, r) in enumerate(zip(lines, rows)):
    if cells[0] != str(i + 1) or cells[1] != want_labels[i]: fail(f"row {i + 1}: {cells[:2]}")
    want = [r["measured_tokens_per_s"], r["predicted_tokens_per_s"],
            r["measured_peak_bytes"] / 2**20, r["predicted_peak_bytes"] / 2**20,
            1000 * r["measured_exposed_comm_s"], 1000 * r["predicted_exposed_comm_s"]]
    got = [float(x) for x in cells[2:]]
    for g, w, name in zip(got, want, ("measured tok/s", "predicted tok/s", "measured MiB",
                                      "predicted MiB", "measured comm", "predicted comm")):
        if abs(g - w) > 1e-9 * max(1.0, abs(w)): fail(f"row {i + 1} {name}: chart {g}, json {w}")
    if not (want[0] > 0 and want[2] > 0): fail(f"row {i + 1}: nothing measured {want}")
    runs = r["measured_step_s_runs"]
    if len(runs) != 2 or abs(r["measured_step_s"] - (runs[0] + runs[1]) / 2) > 1e-12:
        fail(f"row {i + 1}: step {r['measured_step_s']}, not the median of the rounds {runs}")
PY

# The script draws every panel from that data file: measured and predicted columns.
for c in "3:xtic(2)" "5:xtic(2)" "7:xtic(2)" "using 4 " "using 6 " "using 8 "; do
  grep -qF "$c" out/sweep.gp || fail "sweep.gp does not plot '$c'"
done

bad() {   # expected message, then the arguments (after the model); $path: tetra's PATH
  local want="$1"; shift
  rm -rf runs
  env PATH="${path:-$PATH}" "$tetra" sweep "${model[@]}" --steps 3 --layout dp=1,mb=4 \
    --keep runs "$@" >bad.out 2>bad.err
  local rc=$?
  [ "$rc" -eq 2 ] || fail "sweep $*: exit $rc, want 2"
  [ "$(wc -l < bad.err)" -eq 1 ] || fail "sweep $*: $(wc -l < bad.err) lines: $(cat bad.err)"
  grep -qF -- "$want" bad.err || fail "sweep $*: '$(cat bad.err)' lacks '$want'"
  # The layouts' runs write into --keep's folder: none was made, so none ran.
  [ ! -e runs ] || fail "sweep $*: refused only after running"
}
bad "--chart needs a file name ending in .png" --chart out/chart.jpg
bad "--chart: cannot write" --chart nodir/chart.png
path=/nonexistent bad "gnuplot is not installed" --chart out/c2.png
echo "sweep_chart: ok"
