#!/usr/bin/env python3
"""What an overloaded `dsv4 serve` answers: CLIENTS threads each send REQUESTS sequential greedy
32-token /v1/completions requests (no retries), and this prints, as one JSON object, how many
were answered and how many refused (503 `queue_full`, `scheduler.max_queued_requests`), the
median and 99th-percentile latency of the answered ones, and the wall time. Run it against
servers with different limits to compare.

Usage: scripts/overload.py [BASE_URL] [CLIENTS] [REQUESTS]   (default http://127.0.0.1:8000, 64, 8)

Needs the `openai` Python package.
"""

import json
import statistics
import sys
import threading
import time

from openai import APIStatusError, OpenAI

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
CLIENTS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
REQUESTS = int(sys.argv[3]) if len(sys.argv) > 3 else 8
client = OpenAI(base_url=BASE.rstrip("/") + "/v1", api_key="unused", max_retries=0)
MODEL = client.models.list().data[0].id

lock = threading.Lock()
answered_ms, refused, other = [], [0], []


def worker(c):
    for i in range(REQUESTS):
        t = time.perf_counter()
        try:
            client.completions.create(model=MODEL, prompt=f"client {c} request {i}",
                                      max_tokens=32, temperature=0,
                                      extra_body={"ignore_eos": True})
            with lock:
                answered_ms.append((time.perf_counter() - t) * 1000)
        except APIStatusError as e:
            with lock:
                if e.status_code == 503 and "queue_full" in str(e.body):
                    refused[0] += 1
                else:
                    other.append(f"{e.status_code}: {e.body}")


start = time.perf_counter()
threads = [threading.Thread(target=worker, args=(c,)) for c in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
answered_ms.sort()
p99 = answered_ms[min(len(answered_ms) - 1, int(len(answered_ms) * 0.99))] if answered_ms else None
print(json.dumps({
    "answered": len(answered_ms),
    "refused_queue_full": refused[0],
    "other_errors": other[:5],
    "median_ms": round(statistics.median(answered_ms)) if answered_ms else None,
    "p99_ms": round(p99) if p99 is not None else None,
    "seconds": round(time.perf_counter() - start, 2),
}, indent=1))
