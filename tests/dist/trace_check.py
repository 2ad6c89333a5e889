"""Checks a merged Tetra trace of a pp2 1F1B run (tests/dist/trace.sh).

The file validates against tools/trace/trace-event.schema.json (Chrome/Perfetto's Trace
Event Format); each traced step of each stage runs its forwards and backwards in the 1F1B
order (written out here from the schedule's definition, not taken from Tetra); the
activations each stage receives arrive after the previous stage started sending them (on
rank 0's clock: the ranks' clocks are aligned); every step has its data wait and
optimizer regions. Exits 1 with a line per failure.
"""
import json
import sys

import jsonschema

trace_path, schema_path, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
n_micro = int(sys.argv[4])
doc = json.load(open(trace_path))
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


jsonschema.validate(doc, json.load(open(schema_path)))
events = doc["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events
         if e["ph"] == "M" and e["name"] == "process_name"}
if sorted(names) != [0, 1]:
    fail(f"processes {names}")


def one_f_one_b(stage, stages, n):
    """1F1B: stage s runs stages-1-s forwards ahead, then one forward and one backward in
    turn, then the remaining backwards."""
    warm = min(stages - 1 - stage, n)
    order = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while f < n:
        order.append(("F", f)); f += 1
        order.append(("B", b)); b += 1
    order += [("B", m) for m in range(b, n)]
    return order


spans = {}   # (rank, step) -> compute events of that step, by start
for rank in (0, 1):
    compute = sorted((e for e in events if e["ph"] == "X" and e["pid"] == rank and e["tid"] == 0),
                     key=lambda e: e["ts"])
    step_spans = [e for e in compute if e["name"].startswith("step ")]
    if [int(e["name"].split()[1]) for e in step_spans] != steps:
        fail(f"rank {rank}: step spans {[e['name'] for e in step_spans]}, want steps {steps}")
    for s in step_spans:
        inside = [e for e in compute if e is not s and s["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3]
        spans[(rank, s["name"])] = inside
        got = [(e["name"], e["args"]["micro"]) for e in inside if e["name"] in ("F", "B")]
        want = one_f_one_b(rank, 2, n_micro)
        if got != want:
            fail(f"rank {rank} {s['name']}: order {got}, want 1F1B {want}")
        kinds = {e["name"] for e in inside}
        for k in ("data_wait", "optimizer"):
            if k not in kinds:
                fail(f"rank {rank} {s['name']}: no {k} region")
        # Regions of one thread do not overlap (they nest in the step only).
        for a, b in zip(inside, inside[1:]):
            if b["ts"] < a["ts"] + a["dur"] - 1e-3:
                fail(f"rank {rank}: {a['name']} and {b['name']} overlap")

# Communication: rank 0 sends activations to rank 1, which receives them (and sends
# back gradients). The k-th activation received completes after the k-th sent started.
comm = {r: sorted((e for e in events if e["ph"] == "X" and e["pid"] == r and e["tid"] == 1),
                  key=lambda e: e["ts"]) for r in (0, 1)}
sends0 = [e for e in comm[0] if e["name"] == "send" and e["args"]["group"] == "pp"]
recvs1 = [e for e in comm[1] if e["name"] == "recv" and e["args"]["group"] == "pp"]
want_msgs = n_micro * len(steps)
if len(sends0) != want_msgs or len(recvs1) != want_msgs:
    fail(f"{len(sends0)} sends on rank 0, {len(recvs1)} receives on rank 1, want {want_msgs} each")
for k, (s, r) in enumerate(zip(sends0, recvs1)):
    if r["ts"] + r["dur"] < s["ts"] - 50:
        fail(f"activation {k}: received at {r['ts'] + r['dur']:.1f} us, sent at {s['ts']:.1f} us")
if failures:
    sys.exit(1)
print(f"trace ok: {len(events)} events, 1F1B on both stages for steps {steps}, "
      f"{len(sends0)} activations sent before they arrived")
