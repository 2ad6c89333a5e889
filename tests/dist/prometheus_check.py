"""Checks what a real Prometheus scraped from a Tetra run (tests/dist/prometheus.sh).

Queries the Prometheus HTTP API (standard library only) and compares it with the run's
metrics file: every series docs/monitoring.md documents exists for every rank with the
job/rank/dp/tp/pp/cp labels, the step increases, the loss is finite and equals the file's
at the same step, histogram counts equal the steps, phases add up to the step time,
collectives were timed, and every PromQL expression of the Grafana dashboard returns
data. Exits 1 with one line per failure.
"""
import argparse
import json
import math
import re
import sys
import urllib.parse
import urllib.request

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def api(base, path, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=20) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def query(base, expr, t):
    return api(base, "/api/v1/query", query=expr, time=t)["result"]


def query_range(base, expr, start, end, step):
    return api(base, "/api/v1/query_range", query=expr, start=start, end=end,
               step=step)["result"]


def documented_series(doc_path):
    """Series names from the tables of docs/monitoring.md: `tetra_...` / `DCGM_...` in the
    first column."""
    names = []
    for line in open(doc_path, encoding="utf-8"):
        m = re.match(r"\|\s*`((?:tetra|DCGM)_[A-Za-z0-9_]+)`\s*\|\s*(\w+)", line)
        if m:
            names.append((m.group(1), m.group(2)))
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prom", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--checkpoint-every", type=int, required=True)
    ap.add_argument("--restarts", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--doc", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--gpu", action="store_true", help="NVML series are expected too")
    a = ap.parse_args()
    base, job, end = a.prom, a.job, a.end
    ranks = {str(r) for r in range(a.ranks)}
    rows = {r["step"]: r for r in map(json.loads, open(a.metrics))}
    sel = f'job="{job}"'

    # Every rank's target was up while the run lasted (honor_labels: up keeps the scrape
    # job's name, which monitor-config set to the job label).
    up = query_range(base, f"up{{{sel}}}", a.start, end, 0.1)
    if len(up) != a.ranks:
        fail(f"{len(up)} scrape targets, want {a.ranks}")
    for t in up:
        n = sum(1 for _, v in t["values"] if v == "1")
        if n < 5:
            fail(f"target {t['metric'].get('instance')}: up in only {n} scrapes")

    # Every documented series, for every rank.
    names = documented_series(a.doc)
    if len(names) < 20:
        fail(f"only {len(names)} series documented in {a.doc}")
    for name, kind in names:
        if not a.gpu and (name.startswith("DCGM_") or name.startswith("tetra_gpu_")):
            continue
        metric = name + "_count" if kind == "histogram" else name
        got = query(base, f"last_over_time({metric}{{{sel}}}[10m])", end)
        seen = {s["metric"].get("rank") for s in got}
        want = {"0"} if name.startswith("tetra_straggler_") else ranks   # rank 0's summary
        if not want <= seen:
            fail(f"{name}: ranks {sorted(seen)} report it, want {sorted(want)}")

    # The labels of every tetra_ series: job, rank and the mesh coordinates (dp = rank here).
    every = query(base, f'last_over_time({{__name__=~"tetra_.+",{sel}}}[10m])', end)
    for s in every:
        m = s["metric"]
        missing = [k for k in ("job", "rank", "dp", "tp", "pp", "cp") if k not in m]
        if missing:
            fail(f"{m.get('__name__')}: no label {missing}")
        elif m["dp"] != m["rank"] or (m["tp"], m["pp"], m["cp"]) != ("0", "0", "0"):
            fail(f"{m['__name__']} rank {m['rank']}: mesh labels {m}")

    # Per rank: the step increases over the scrapes, the loss is finite and equals the
    # metrics file's at that step, the histogram counts equal the step.
    step = 0.1
    for r in sorted(ranks):
        lab = f'{sel},rank="{r}"'
        series = {}
        for key, expr in (("step", f"tetra_step{{{lab}}}"),
                          ("loss", f"tetra_loss{{{lab}}}"),
                          ("tokens", f"tetra_tokens_total{{{lab}}}"),
                          ("count", f"tetra_step_seconds_count{{{lab}}}"),
                          ("inf", f'tetra_step_seconds_bucket{{{lab},le="+Inf"}}'),
                          ("sum", f"tetra_step_seconds_sum{{{lab}}}"),
                          ("phases", f"sum without (phase) (tetra_step_phase_seconds_total{{{lab}}})")):
            res = query_range(base, expr, a.start, end, step)
            if len(res) != 1:
                fail(f"rank {r}: {expr} gives {len(res)} series")
                series[key] = {}
            else:
                series[key] = {float(t): float(v) for t, v in res[0]["values"]}
        steps = [series["step"][t] for t in sorted(series["step"])]
        distinct = sorted(set(steps))
        if len(distinct) < 3:
            fail(f"rank {r}: only {len(distinct)} distinct steps scraped ({distinct})")
        if any(b < a_ for a_, b in zip(steps, steps[1:])):
            fail(f"rank {r}: the step went backwards: {steps}")
        if distinct and (distinct[-1] > a.steps or distinct[0] < 0):
            fail(f"rank {r}: step {distinct[-1]} outside 0..{a.steps}")
        compared = 0
        for t, s in series["step"].items():
            if s < 1:
                continue
            row = rows.get(int(s))
            loss = series["loss"].get(t)
            if loss is None or not math.isfinite(loss):
                fail(f"rank {r} step {s}: loss {loss}")
                continue
            if row and abs(loss - row["loss"]) > 1e-6 * max(1.0, abs(row["loss"])):
                fail(f"rank {r} step {s}: loss {loss} but the metrics file says {row['loss']}")
            if row and series["tokens"].get(t) != row["tokens"]:
                fail(f"rank {r} step {s}: tokens_total {series['tokens'].get(t)}, file {row['tokens']}")
            if series["count"].get(t) != s:
                fail(f"rank {r} step {s}: step_seconds_count {series['count'].get(t)}")
            if series["inf"].get(t) != series["count"].get(t):
                fail(f"rank {r} step {s}: the +Inf bucket {series['inf'].get(t)} != count")
            tot, ph = series["sum"].get(t), series["phases"].get(t)
            if tot is None or ph is None or abs(tot - ph) > 1e-6 * max(1.0, tot):
                fail(f"rank {r} step {s}: phases add up to {ph} s, steps to {tot} s")
            compared += 1
        if compared < 3:
            fail(f"rank {r}: only {compared} scrapes compared with the metrics file")

        # Collectives: data parallelism's gradient all-reduce, timed and counted.
        # At least one gradient all-reduce per step, scrape by scrape.
        coll = query_range(base, f'tetra_collective_seconds_count{{{lab},op="all_reduce"}}',
                           a.start, end, step)
        groups = {c["metric"]["group"]: {float(t): float(v) for t, v in c["values"]}
                  for c in coll}
        dp_counts = groups.get("dp") or groups.get("dpcp") or {}
        short = [(series["step"][t], n) for t, n in dp_counts.items()
                 if t in series["step"] and n < series["step"][t]]
        if len(dp_counts) < 3 or short:
            fail(f"rank {r}: all_reduce counts on dp/dpcp in {len(dp_counts)} scrapes, "
                 f"fewer than the step in {short[:3]}")
        for g in groups:
            if g not in ("dp", "dpcp", "world"):
                fail(f"rank {r}: all_reduce on unexpected group {g}")
        s = query(base, f"last_over_time(tetra_collective_seconds_sum{{{lab},op=\"all_reduce\"}}[10m])", end)
        if not s or min(float(x["value"][1]) for x in s) <= 0:
            fail(f"rank {r}: no all_reduce time summed")

        # The constant figures.
        got = query(base, f"last_over_time(tetra_restarts{{{lab}}}[10m])", end)
        if not got or float(got[0]["value"][1]) != a.restarts:
            fail(f"rank {r}: tetra_restarts {got}, want {a.restarts} (TETRA_RESTART_COUNT)")
        got = query(base, f"max_over_time(tetra_checkpoint_saves_total{{{lab}}}[10m])", end)
        last_step = max(distinct) if distinct else 0
        want = max(0, int(last_step) - 1) // a.checkpoint_every   # a step's save follows its record
        if not got or float(got[0]["value"][1]) < want:
            fail(f"rank {r}: tetra_checkpoint_saves_total {got}, want >= {want} by step {last_step}")
        got = query(base, f"max_over_time(tetra_checkpoint_save_seconds{{{lab}}}[10m])", end)
        if want and (not got or float(got[0]["value"][1]) <= 0):
            fail(f"rank {r}: checkpoint save seconds {got}")
        got = query(base, f"max_over_time(tetra_mfu{{{lab}}}[10m])", end)
        if not got or not 0 < float(got[0]["value"][1]) < 1:
            fail(f"rank {r}: MFU {got} (train.peak_tflops is set: want 0 < mfu < 1)")

    # Every PromQL expression of the dashboard returns data over the run.
    dash = json.load(open(a.dashboard))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    ran = skipped = 0
    for e in exprs:
        if not a.gpu and "DCGM_" in e:
            skipped += 1
            continue
        q = (e.replace("$__rate_interval", "1s").replace('"$job"', f'"{job}"')
              .replace('"$rank"', '"' + "|".join(sorted(ranks)) + '"'))
        if "$" in q:
            fail(f"dashboard expression with an unknown variable: {e}")
            continue
        res = query_range(base, q, a.start, end, step)
        values = [v for s in res for _, v in s["values"] if v not in ("NaN",)]
        if not values:
            fail(f"dashboard expression returns no data: {q}")
        ran += 1

    # The alert rules loaded and evaluate; none fires on a healthy run.
    groups = api(base, "/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    if len(rules) < 9:
        fail(f"{len(rules)} alert rules loaded, want the 9 of tetra-rules.yml")
    for rule in rules:
        if rule.get("health") not in ("ok",):
            fail(f"rule {rule['name']}: health {rule.get('health')} {rule.get('lastError')}")
        if rule.get("state") == "firing":
            fail(f"rule {rule['name']} fires on a healthy run")

    if failures:
        print(f"{len(failures)} failures")
        return 1
    print(f"prometheus ok: {len(names)} documented series on {a.ranks} ranks, "
          f"{len(every)} tetra_ series, {ran} dashboard expressions with data"
          + (f" ({skipped} GPU ones skipped: no NVML here)" if skipped else "")
          + f", {len(rules)} rules healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
