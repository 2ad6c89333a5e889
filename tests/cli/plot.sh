#!/usr/bin/env bash
# tetra plot OUT_DIR FILE... [--label NAME=FILE]: two real training runs' metrics become
# valid 960x540 PNGs (loss, lr, throughput, grad norm, a step breakdown per run); the data
# files tetra hands gnuplot hold the JSONL's values, and what gnuplot plots for the loss
# chart (its `set table` output of the very commands in plot.gp) is the JSONL's train
# and eval loss, run by run under their labels. Bad inputs are one line and exit 2.
# Usage: bash plot.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python3}"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! command -v gnuplot >/dev/null; then
  [ "${CI:-}" = true ] && fail "no gnuplot (CI=true; tools/setup installs gnuplot-nox)"
  echo "SKIP: no gnuplot"; exit 77
fi

cd "$tmp"
run() {   # metrics file, then --set values
  local out="$1"; shift
  "$tetra" run "$here/../../recipes/tiny.lua" --set train.steps=12 --set train.eval_every=4 \
    --set log.progress=false --set log.metrics_file="$out" "$@" >"$out.log" 2>&1 ||
    fail "training run for $out: $(tail -3 "$out.log")"
}
run base.jsonl
run fast.jsonl --set train.lr=1e-2

"$tetra" plot charts base.jsonl --label "lr 1e-2=fast.jsonl" >out 2>err || fail "plot: $(cat err)"
want="loss lr throughput grad_norm step_breakdown_base step_breakdown_lr_1e-2"
for c in $want; do
  [ -f "charts/$c.png" ] || fail "no charts/$c.png ($(cat out))"
done
[ "$(ls charts/*.png | wc -l)" -eq 6 ] || fail "$(ls charts/*.png | wc -l) PNGs, want 6"

# The loss chart's commands from plot.gp, drawn into a table instead of a PNG.
awk '/^set terminal/ || /^set datafile/ || /^set style line/ || /^set linetype/ {print}
     /^set output .*loss\.png/ {on=1; print "set table \"loss.tab\""; next}
     /^set output/ {on=0} on {print}' charts/plot.gp > table.gp
gnuplot table.gp 2>gp.err || fail "gnuplot set table: $(cat gp.err)"

"$py" - charts base.jsonl fast.jsonl loss.tab <<'PY' || exit 1
import json, math, struct, sys, zlib
charts, base, fast, tab = sys.argv[1:]
def fail(msg):
    print("FAIL:", msg); sys.exit(1)

# Valid PNGs: signature, an IHDR of 960 x 540 first, every chunk's CRC right, IEND last.
import glob
for p in glob.glob(charts + "/*.png"):
    b = open(p, "rb").read()
    if b[:8] != b"\x89PNG\r\n\x1a\n": fail(p + ": no PNG signature")
    pos, kinds = 8, []
    while pos < len(b):
        n, kind = struct.unpack(">I4s", b[pos:pos + 8])
        data = b[pos + 8:pos + 8 + n]
        crc, = struct.unpack(">I", b[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + data) != crc: fail(p + ": bad CRC in " + kind.decode())
        if kind == b"IHDR":
            w, h = struct.unpack(">II", data[:8])
            if (w, h) != (960, 540): fail(f"{p}: {w}x{h}, want 960x540")
        kinds.append(kind)
        pos += 12 + n
    if kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        fail(p + ": chunks " + str(kinds))
    if len(b) < 5000: fail(p + f": {len(b)} bytes, an empty chart?")

def records(path):
    return [json.loads(l) for l in open(path) if l.strip()]
cols = "step loss lr grad_norm tokens_per_s data_wait_s forward_s backward_s " \
       "exposed_comm_s optimizer_s checkpoint_s other_s".split()
def close(a, b):
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))

# The data files: every record's columns, and the eval points.
for label, src in (("base", base), ("lr_1e-2", fast)):
    recs = records(src)
    rows = [l.split() for l in open(f"{charts}/data/{label}.dat") if not l.startswith("#")]
    if len(rows) != len(recs): fail(f"{label}.dat: {len(rows)} rows, {len(recs)} records")
    for r, rec in zip(rows, recs):
        if r[0] == "NaN" or [float(x) for x in r[:1]] != [rec["step"]]: fail(f"{label}.dat: {r}")
        for c, v in zip(cols, r):
            if c in rec and not close(float(v), rec[c]):
                fail(f"{label}.dat step {rec['step']} {c}: {v}, the file has {rec[c]}")
            if c not in rec and v != "NaN": fail(f"{label}.dat: {c} absent but {v}")
    ev = [l.split() for l in open(f"{charts}/data/{label}.eval.dat") if not l.startswith("#")]
    want = [(r["step"], r["eval_loss"]) for r in recs if "eval_loss" in r]
    if len(want) != 3 or [(float(a), float(b)) for a, b in ev] != \
       [(float(a), float(b)) for a, b in want]:
        fail(f"{label}.eval.dat {ev}, the file has {want}")

# What gnuplot drew for the loss chart: one curve per plot command, in order (base train,
# base eval, fast train, fast eval), each the JSONL's points.
curves, titles, cur = [], [], None
for line in open(tab):
    if line.startswith("# Curve title: "):
        titles.append(line[len("# Curve title: "):].strip().strip('"'))
    elif line.startswith("# Curve "):
        cur = []; curves.append(cur)
    elif line.strip() and not line.startswith("#") and cur is not None:
        x, y = line.split()[:2]
        cur.append((float(x), float(y)))
if len(curves) != 4: fail(f"loss chart: {len(curves)} curves, want 4")
if titles != ["base train", "base eval", "lr 1e-2 train", "lr 1e-2 eval"]:
    fail(f"loss chart's legend: {titles}")
for i, src in enumerate((base, fast)):
    recs = records(src)
    train = [(r["step"], r["loss"]) for r in recs]
    ev = [(r["step"], r["eval_loss"]) for r in recs if "eval_loss" in r]
    for got, want, what in ((curves[2 * i], train, "train"), (curves[2 * i + 1], ev, "eval")):
        if len(got) != len(want) or not all(
                a == b and abs(c - d) <= 1e-6 * abs(d) for (a, c), (b, d) in zip(got, want)):
            fail(f"{src} {what} loss plotted {got[:3]}..., the file has {want[:3]}...")
PY

# Two files of the same name (two runs' folders): labelled by their paths.
mkdir -p r1 r2 && cp base.jsonl r1/metrics.jsonl && cp fast.jsonl r2/metrics.jsonl
"$tetra" plot same r1/metrics.jsonl r2/metrics.jsonl >out 2>err || fail "plot same: $(cat err)"
grep -q "title 'r1/metrics train'" same/plot.gp && grep -q "title 'r2/metrics train'" same/plot.gp &&
  [ -f same/step_breakdown_r1_metrics.png ] && [ -f same/step_breakdown_r2_metrics.png ] ||
  fail "two metrics.jsonl: labels $(grep -o "title '[^']*'" same/plot.gp | sort -u | tr '\n' ' ')"

bad() {   # expected message, then the arguments
  local want="$1"; shift
  "$tetra" plot "$@" >bad.out 2>bad.err
  local rc=$?
  [ "$rc" -eq 2 ] || fail "plot $*: exit $rc, want 2"
  [ "$(wc -l < bad.err)" -eq 1 ] || fail "plot $*: $(wc -l < bad.err) lines: $(cat bad.err)"
  grep -qF -- "$want" bad.err || fail "plot $*: '$(cat bad.err)' lacks '$want'"
}
bad "cannot read missing.jsonl" out2 missing.jsonl
printf '{"displayTimeUnit":"ms","traceEvents":[\n' > trace.json
bad "trace.json:1: not a metrics record" out2 trace.json
printf '{"step":1,"loss":2.5}\nnot json\n' > broken.jsonl
bad "broken.jsonl:2: not a metrics record" out2 broken.jsonl
printf '{"step":1,"loss":2.5}\n{"step":2,"name":"F","ph":"X"}\n' > events.jsonl
bad "events.jsonl:2: not a metrics record" out2 events.jsonl
: > empty.jsonl
bad "empty.jsonl: no metrics records" out2 empty.jsonl
bad "needs OUT_DIR and at least one metrics file" out2
bad "--label needs NAME=FILE" out2 base.jsonl --label base.jsonl
bad "cannot read other.jsonl" out2 base.jsonl --label x=other.jsonl
bad "unknown option '--size'" out2 base.jsonl --size 3
mkdir no_gnuplot   # the tools the test itself needs, and no gnuplot
for t in sh wc grep cat; do ln -s "$(command -v $t)" no_gnuplot/$t; done
PATH="$tmp/no_gnuplot" bad "gnuplot is not installed" out2 base.jsonl
echo "PASS plot"
