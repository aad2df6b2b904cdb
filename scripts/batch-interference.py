#!/usr/bin/env python3
"""What a running /v1/batches batch costs interactive requests, against a running `dsv4 serve`:
the median and worst latency of sequential 16-token /v1/completions requests alone, then beside
a batch of LINES greedy 32-token completions whose lines run at their default priority (-1), and
beside the same batch with `"priority": 0` in every line (the order before priorities); and how
long the batch takes alone. Each batch case runs twice.

Usage: scripts/batch-interference.py [BASE_URL] [LINES] [--skip-priority-0] [--every MS]
                                     [--poisson MS]
       (default http://127.0.0.1:8000, 768; --skip-priority-0 leaves out the lines at priority 0,
       to compare servers, e.g. under different server.batch_max_running)

With --every MS it measures something else: a batch running while one interactive request
starts every MS milliseconds until the batch ends (twice), reporting the batch's time, the
interactive median and worst, and how many times batch lines paused
(dsv4:num_yield_preemptions_total), to see what traffic that comes and goes costs a batch
under server.batch_fill_idle_ms. --poisson MS does the same with random gaps: the time from
one request's start to the next is exponential with mean MS (seeded, so runs repeat; a request
still running when its gap is up delays the next), as traffic from many independent clients
arrives. Both also report dsv4:batch_fill_idle_seconds, the fill's idle time in force at the
end (null without a fill).

The interactive requests start once 64 lines have answered and stop after 20. Prints one JSON
object. Needs the `openai` Python package (the batch goes through the Files and Batch APIs).
"""

import json
import random
import statistics
import sys
import threading
import time
import urllib.request

from openai import OpenAI

SKIP_PRIORITY_0 = "--skip-priority-0" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a != "--skip-priority-0"]
EVERY_MS = None
if "--every" in ARGS:
    i = ARGS.index("--every")
    EVERY_MS = int(ARGS[i + 1])
    del ARGS[i:i + 2]
POISSON = "--poisson" in ARGS
if POISSON:
    i = ARGS.index("--poisson")
    EVERY_MS = int(ARGS[i + 1])
    del ARGS[i:i + 2]
BASE = ARGS[0] if ARGS else "http://127.0.0.1:8000"
LINES = int(ARGS[1]) if len(ARGS) > 1 else 768
client = OpenAI(base_url=BASE.rstrip("/") + "/v1", api_key="unused")
MODEL = client.models.list().data[0].id
ENDED = ("completed", "failed", "cancelled", "expired")


def batch_file(priority):
    lines = []
    for i in range(LINES):
        body = {"model": MODEL, "prompt": f"batch line {i}", "max_tokens": 32,
                "temperature": 0, "ignore_eos": True}
        if priority is not None:
            body["priority"] = priority
        lines.append(json.dumps({"custom_id": f"b{i}", "method": "POST",
                                 "url": "/v1/completions", "body": body}))
    return "\n".join(lines).encode()


def start(priority):
    f = client.files.create(file=("b.jsonl", batch_file(priority)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/completions",
                                 completion_window="24h")


def wait(batch):
    while (b := client.batches.retrieve(batch.id)).status not in ENDED:
        time.sleep(0.02)
    return b.status


def interactive(n=20):
    ms = []
    for i in range(n):
        t = time.perf_counter()
        client.completions.create(model=MODEL, prompt=f"interactive {i}", max_tokens=16,
                                  temperature=0, extra_body={"ignore_eos": True})
        ms.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(ms)), "worst_ms": round(max(ms))}


def beside(priority):
    batch = start(priority)
    while client.batches.retrieve(batch.id).request_counts.completed < 64:
        time.sleep(0.01)
    out = interactive()
    out["batch"] = wait(batch)
    return out


def alone_batch():
    t = time.perf_counter()
    status = wait(start(None))
    return {"seconds": round(time.perf_counter() - t, 2), "batch": status}


def gauge(name):
    """The unlabelled metric `name` on /metrics, or None when it is not there."""
    text = urllib.request.urlopen(BASE.rstrip("/") + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def pauses():
    return int(gauge("dsv4:num_yield_preemptions_total") or 0)


def periodic():
    """The batch while an interactive request starts every EVERY_MS ms (on average, with
    --poisson) until it ends."""
    before = pauses()
    gaps = random.Random(0)
    t = time.perf_counter()
    batch = start(None)
    done = threading.Event()
    ms = []

    def tick():
        i = 0
        while not done.is_set():
            started = time.perf_counter()
            client.completions.create(model=MODEL, prompt=f"interactive {i}", max_tokens=16,
                                      temperature=0, extra_body={"ignore_eos": True})
            ms.append((time.perf_counter() - started) * 1000)
            i += 1
            gap = gaps.expovariate(1000 / EVERY_MS) if POISSON else EVERY_MS / 1000
            done.wait(max(0.0, gap - (time.perf_counter() - started)))

    thread = threading.Thread(target=tick)
    thread.start()
    status = wait(batch)
    seconds = round(time.perf_counter() - t, 2)
    done.set()
    thread.join()
    return {"batch_seconds": seconds, "batch": status, "interactive": len(ms),
            "median_ms": round(statistics.median(ms)), "worst_ms": round(max(ms)),
            "line_pauses": pauses() - before,
            "fill_idle_seconds": gauge("dsv4:batch_fill_idle_seconds")}


if EVERY_MS is not None:
    kind = "poisson" if POISSON else "every"
    print(json.dumps({f"{kind}_{EVERY_MS}_ms_{run}": periodic() for run in (1, 2)}, indent=1))
    sys.exit(0)

result = {"alone": interactive()}
for run in (1, 2):
    result[f"beside_default_priority_{run}"] = beside(None)
    if not SKIP_PRIORITY_0:
        result[f"beside_priority_0_{run}"] = beside(0)
    result[f"batch_alone_{run}"] = alone_batch()
print(json.dumps(result, indent=1))
