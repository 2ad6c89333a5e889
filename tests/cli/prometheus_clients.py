"""Clients for tests/cli/prometheus_endpoint.sh, loopback only, each bounded in time.

  prometheus_clients.py toggle PORT SECONDS HZ WINDOW
      alternates WINDOW seconds of scraping at HZ with WINDOW seconds of quiet during one
      run; prints the mean step time of each kind (from the step histogram's sum/count)
      and the time training waited for the store's lock, as a share of the steps' time.
  prometheus_clients.py hostile PORT SECONDS
      while the run trains: 20 clients that connect and stall mid-request, 5 that send
      garbage, 2 that send a request and never read the answer, 1 that POSTs, 1 that
      asks for another path; meanwhile a normal scrape every 50 ms must answer within
      1 s with the step going up. Exit 1 with a line per failure.
"""
import http.client
import json
import math
import os
import re
import socket
import sys
import time


def wait_up(port, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def get(port, path="/metrics", timeout=1.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def step_of(text):
    m = re.search(r"^tetra_step\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def value(text, name):
    m = re.search(r"^" + name + r"\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def sums(text):
    """(tetra_step_seconds_sum, tetra_step_seconds_count, the store's lock wait, the
    process's CPU seconds, the endpoint thread's CPU seconds) of one scrape."""
    return (value(text, "tetra_step_seconds_sum"), value(text, "tetra_step_seconds_count"),
            value(text, "tetra_telemetry_lock_wait_seconds_total"),
            value(text, "tetra_process_cpu_seconds_total"),
            value(text, "tetra_exporter_cpu_seconds_total"))


def pool(path):
    """The paired estimate over every run whose windows toggle appended to `path`."""
    runs = [json.loads(line) for line in open(path)]
    for kind in ("loud", "decoy"):
        logs = []
        for w in runs:
            logs += paired_logs(w, kind)
        if logs:
            est, half = estimate(logs)
            print(f"{kind}: {est:+.2f}% +- {half:.2f}% (95%) over {len(logs)} windows of {len(runs)} runs")
    return 0


def estimate(logs):
    """The mean of log ratios as a percent change, and its 95% half-width (2 standard
    errors)."""
    if len(logs) < 2:
        return float("nan"), float("nan")
    m = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    return (math.exp(m) - 1) * 100, 2 * sd / math.sqrt(len(logs)) * 100


def paired_logs(windows, kind):
    """log(step time of each of `kind`'s windows / the mean of the quiet windows on either
    side): slow drifts of the machine's speed cancel within each triple."""
    logs = []
    for i in range(1, len(windows) - 1):
        (k0, a), (k, b), (k1, c) = windows[i - 1], windows[i], windows[i + 1]
        if k == kind and k0 == "quiet" and k1 == "quiet":
            logs.append(math.log(b / ((a + c) / 2)))
    return logs


def toggle(port, seconds, hz, window, decoy=None):
    """Windows of `window` seconds during one run, taking turns: quiet, scraping the run at
    hz, quiet, and (given a decoy port) scraping the decoy at hz: another server on
    loopback serving the same text, so the machine carries the same scraper and serving
    without the run's endpoint in it. One scrape of the run at each window's end. Within
    one run, so the machine's load changes hit every kind alike.
    Per kind: the mean step time (the step histogram's sum and count) and the CPU time
    training used per step (the process's CPU seconds less the endpoint thread's; the wall
    time measures the machine's other jobs too, the CPU time much less); the endpoint's own
    cost from its thread's CPU seconds. Scraped against decoy windows is what the endpoint
    costs training; decoy against quiet what a busy neighbour costs on this machine."""
    if not wait_up(port, 30) or (decoy and not wait_up(decoy, 30)):
        print("toggle: the endpoint never came up")
        return 1
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    d = decoy and http.client.HTTPConnection("127.0.0.1", decoy, timeout=5)

    def scrape_once():
        c.request("GET", "/metrics")
        return sums(c.getresponse().read().decode())

    kinds = ["quiet", "loud", "quiet", "decoy"] if decoy else ["quiet", "loud"]
    # per kind: step seconds, steps, training CPU seconds, endpoint CPU seconds
    totals = {k: [0.0, 0.0, 0.0, 0.0] for k in kinds}
    windows = []   # (kind, mean step seconds) of each window in turn
    n, end, turn = 0, time.monotonic() + seconds, 0
    try:
        first = scrape_once()
        while time.monotonic() < end:
            kind = kinds[turn % len(kinds)]
            turn += 1
            stop = time.monotonic() + window
            while time.monotonic() < stop:
                if kind == "quiet":
                    time.sleep(0.01)
                    continue
                if kind == "loud":
                    scrape_once()
                    n += 1
                else:
                    d.request("GET", "/metrics")
                    d.getresponse().read()
                time.sleep(1.0 / hz)
            last = scrape_once()
            t = totals[kind]
            t[0] += last[0] - first[0]
            t[1] += last[1] - first[1]
            exporter = last[4] - first[4]
            t[2] += (last[3] - first[3]) - exporter
            t[3] += exporter
            if last[1] > first[1]:
                windows.append((kind, (last[0] - first[0]) / (last[1] - first[1])))
            first = last
    except (OSError, http.client.HTTPException):
        pass   # the run ended
    q, l = totals["quiet"], totals["loud"]
    if q[1] < 20 or l[1] < 20 or (decoy and totals["decoy"][1] < 20):
        print(f"toggle: too few steps measured ({q[1]:.0f} quiet, {l[1]:.0f} loud)")
        return 1

    def per_step(k):
        t = totals[k]
        return t[0] / t[1] * 1e3, t[2] / t[1] * 1e3

    def pct(a, b):
        return (a / b - 1) * 100

    quiet_ms, quiet_cpu = per_step("quiet")
    loud_ms, loud_cpu = per_step("loud")
    waited, stepped = first[2], first[0]
    line = (f"toggle: {n} scrapes; mean step {quiet_ms:.2f} ms over {q[1]:.0f} quiet steps, "
            f"{loud_ms:.2f} ms over {l[1]:.0f} steps scraped at {hz:.0f}/s "
            f"({pct(loud_ms, quiet_ms):+.1f}%); training CPU per step "
            f"{quiet_cpu:.2f} ms quiet, {loud_cpu:.2f} ms scraped [{pct(loud_cpu, quiet_cpu):+.2f}%]; ")
    if decoy:
        decoy_ms, decoy_cpu = per_step("decoy")
        line += (f"decoy scraped {decoy_ms:.2f} ms ({pct(decoy_ms, quiet_ms):+.1f}% on quiet), "
                 f"the endpoint's own {{{pct(loud_ms, decoy_ms):+.2f}%}} "
                 f"[CPU {pct(loud_cpu, decoy_cpu):+.2f}%]; ")
    keep = os.environ.get("TOGGLE_WINDOWS")   # pooled over runs by tools/bench/prometheus.sh
    if keep:
        with open(keep, "a") as f:
            f.write(json.dumps(windows) + "\n")
    est, half = estimate(paired_logs(windows, "loud"))
    line += f"paired windows: scraped {est:+.2f}% +- {half:.2f}% (95%) on the quiet ones beside them; "
    line += (f"endpoint thread {l[3] * 1e3:.1f} ms CPU for {n} scrapes "
             f"<{l[3] / max(l[2], 1e-9) * 100:.3f}% of training CPU>; training waited "
             f"{waited * 1e3:.3f} ms for the store in {stepped:.1f} s of steps "
             f"({waited / stepped * 100:.4f}%)")
    print(line)
    return 0


def decoy(port, own, seconds):
    """Serves, on port `own` for `seconds`, the text the run's endpoint (port) gave once:
    the stand-in server of toggle's decoy windows."""
    import http.server
    if not wait_up(port, 30):
        print("decoy: the endpoint never came up")
        return 1
    _, text = get(port)
    body = text.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", own), Handler)
    server.timeout = 0.2
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        server.handle_request()
    return 0


def hostile(port, seconds):
    if not wait_up(port, 30):
        print("FAIL: the endpoint never came up")
        return 1
    fails = []
    held = []
    for _ in range(20):   # connect and stall in the middle of the request line
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"GET /metr")
        held.append(s)
    for junk in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"BREW /metrics HTCPCP/1.0\r\n\r\n", b"GET " + b"A" * 70000 + b" HTTP/1.1\r\n\r\n",
                 b"\r\n\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            s.sendall(junk)
        except OSError:
            pass   # the server may drop it at once
        held.append(s)
    for _ in range(2):    # a request whose answer is never read
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
        held.append(s)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    c.request("POST", "/metrics", body=b"x" * 1000)
    if c.getresponse().status != 405:
        fails.append("POST /metrics did not answer 405")
    c.close()
    if get(port, "/nothing")[0] != 404:
        fails.append("GET /nothing did not answer 404")

    steps, slowest, n = [], 0.0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            status, text = get(port, timeout=1.0)
        except (ConnectionRefusedError, ConnectionResetError):
            break   # the run finished
        except OSError as e:
            fails.append(f"a normal scrape failed with hostile clients connected: {e!r}")
            break
        slowest = max(slowest, time.monotonic() - t0)
        if status != 200:
            fails.append(f"status {status}")
            break
        n += 1
        s = step_of(text)
        if s is not None:
            steps.append(s)
        time.sleep(0.05)
    for s in held:
        s.close()
    if n < 10:
        fails.append(f"only {n} normal scrapes answered while hostile clients were connected")
    if len(set(steps)) < 3:
        fails.append(f"the step did not advance under hostile clients: {sorted(set(steps))}")
    if any(b < a for a, b in zip(steps, steps[1:])):
        fails.append("the step went backwards")
    for f in fails:
        print("FAIL: " + f)
    print(f"hostile: {n} scrapes answered (slowest {slowest * 1e3:.1f} ms), steps "
          f"{steps[0] if steps else None} -> {steps[-1] if steps else None}")
    return 1 if fails else 0


if __name__ == "__main__":
    mode = sys.argv[1]
    port = 0 if mode == "pool" else int(sys.argv[2])
    if mode == "toggle":
        sys.exit(toggle(port, float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]),
                        int(sys.argv[6]) if len(sys.argv) > 6 else None))
    if mode == "pool":
        sys.exit(pool(sys.argv[2]))
    if mode == "decoy":
        sys.exit(decoy(port, int(sys.argv[3]), float(sys.argv[4])))
    sys.exit(hostile(port, float(sys.argv[3])))
