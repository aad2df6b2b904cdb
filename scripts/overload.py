#!/usr/bin/env python3
"""What an overloaded `dsv4 serve` answers: CLIENTS threads each send REQUESTS sequential greedy
32-token /v1/completions requests (no retries), and this prints, as one JSON object, how many
were answered and how many refused (503 `queue_full`, `scheduler.max_queued_requests`), the
median and 99th-percentile latency of the answered ones, and the wall time. Run it against
servers with different limits to compare. With --urgent K, the first K clients send
`"priority": 10` and the others 0, and the counts are also given for each class ("urgent",
"normal"), to see a higher priority take a waiting request's place at a full queue.

Usage: scripts/overload.py [BASE_URL] [CLIENTS] [REQUESTS] [--urgent K]
       (default http://127.0.0.1:8000, 64, 8, no urgent clients)

Needs the `openai` Python package.
"""

import json
import statistics
import sys
import threading
import time

from openai import APIStatusError, OpenAI

ARGS = sys.argv[1:]
URGENT = 0
if "--urgent" in ARGS:
    i = ARGS.index("--urgent")
    URGENT = int(ARGS[i + 1])
    del ARGS[i:i + 2]
BASE = ARGS[0] if len(ARGS) > 0 else "http://127.0.0.1:8000"
CLIENTS = int(ARGS[1]) if len(ARGS) > 1 else 64
REQUESTS = int(ARGS[2]) if len(ARGS) > 2 else 8
client = OpenAI(base_url=BASE.rstrip("/") + "/v1", api_key="unused", max_retries=0)
MODEL = client.models.list().data[0].id

lock = threading.Lock()
# Per class: answered latencies (ms) and refusals.
classes = {"urgent": ([], [0]), "normal": ([], [0])}
other = []


def worker(c):
    name = "urgent" if c < URGENT else "normal"
    answered_ms, refused = classes[name]
    extra = {"ignore_eos": True, "priority": 10 if name == "urgent" else 0}
    for i in range(REQUESTS):
        t = time.perf_counter()
        try:
            client.completions.create(model=MODEL, prompt=f"client {c} request {i}",
                                      max_tokens=32, temperature=0, extra_body=extra)
            with lock:
                answered_ms.append((time.perf_counter() - t) * 1000)
        except APIStatusError as e:
            with lock:
                if e.status_code == 503 and "queue_full" in str(e.body):
                    refused[0] += 1
                else:
                    other.append(f"{e.status_code}: {e.body}")


def summary(answered_ms, refused):
    answered_ms = sorted(answered_ms)
    p99 = answered_ms[min(len(answered_ms) - 1, int(len(answered_ms) * 0.99))] \
        if answered_ms else None
    return {
        "answered": len(answered_ms),
        "refused_queue_full": refused,
        "median_ms": round(statistics.median(answered_ms)) if answered_ms else None,
        "p99_ms": round(p99) if p99 is not None else None,
    }


start = time.perf_counter()
threads = [threading.Thread(target=worker, args=(c,)) for c in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
seconds = round(time.perf_counter() - start, 2)
result = summary(classes["urgent"][0] + classes["normal"][0],
                 classes["urgent"][1][0] + classes["normal"][1][0])
result["other_errors"] = other[:5]
result["seconds"] = seconds
if URGENT:
    for name, (answered_ms, refused) in classes.items():
        result[name] = summary(answered_ms, refused[0])
print(json.dumps(result, indent=1))
