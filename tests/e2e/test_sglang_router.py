#!/usr/bin/env python3
"""End-to-end: dsv4 servers behind SGLang's router (the `sglang-router` package).

Run against a router whose workers are `dsv4 serve` processes:

    python3 tests/e2e/test_sglang_router.py --router http://127.0.0.1:30000 \
        --workers http://127.0.0.1:8001 http://127.0.0.1:8002 [--model dsv4-tiny]

`cargo test -p dsv4-cli --test server_e2e` starts two `dsv4 serve --port 0` and the router
(`python3 -m sglang_router.launch_router ... --policy power_of_two`) and runs this script.

The router rewrites every body it forwards into its own request types, adding SGLang's fields
at their defaults (`no_stop_trim`, `separate_reasoning`, `return_hidden_states`, ...), so each
route is checked through it: chat (plain and streamed, with the official `openai` client),
completions, the Responses API, SGLang's `/generate`; then the load the router balances on:
with long requests in flight on both workers, its `/get_loads` shows each worker's
`num_tokens` from dsv4's `/get_load` (a worker whose `/get_load` failed would show -1).

The tiny model has random weights, so chat answers are constrained to a JSON schema: free text
may hold special tokens that the strict DSV4 parser refuses (and the router allows at most four
stop strings, too few to cut them all off).
"""

import argparse
import json
import threading
import time
import urllib.request

import openai
from harness import run_tests

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


def http(method, url, body=None, timeout=120):
    """The JSON answer of one request (raises on a non-2xx status)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_chat(client, model, a):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is it fine?"}],
        response_format=JSON_FORMAT, max_tokens=64, temperature=0)
    assert set(json.loads(r.choices[0].message.content)) == {"ok"}, r


def test_streaming_chat(client, model, a):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is it fine?"}],
        response_format=JSON_FORMAT, max_tokens=64, temperature=0, stream=True)
    content, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop", finish
    assert set(json.loads(content)) == {"ok"}, content


def test_completions(client, model, a):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8,
                                  temperature=0)
    assert r.choices[0].finish_reason == "length", r
    assert r.usage.completion_tokens == 8, r


def test_responses(client, model, a):
    r = client.responses.create(
        model=model, input="Is it fine?", max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}})
    assert r.status == "completed", r
    assert set(json.loads(r.output_text)) == {"ok"}, r.output_text


def test_generate(client, model, a):
    r = http("POST", a.router + "/generate",
             {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8}})
    assert len(r["output_ids"]) == 8, r
    assert r["meta_info"]["completion_tokens"] == 8, r


def test_load_reaches_the_router(client, model, a):
    """Long requests on every worker; the router's /get_loads shows their tokens."""
    body = {"model": model, "prompt": "hello world", "max_tokens": 4000, "ignore_eos": True}
    errors = []

    def run(url):
        try:
            http("POST", url + "/v1/completions", body, timeout=600)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{url}: {e}")

    # Straight to each worker, so both are loaded whatever the policy picks.
    threads = [threading.Thread(target=run, args=(w,)) for w in a.workers for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    seen = None
    while time.time() < deadline:
        seen = http("GET", a.router + "/get_loads")
        loads = {w["worker"]: w["load"] for w in seen["workers"]}
        if set(loads) == set(a.workers) and all(v > 0 for v in loads.values()):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the router never saw both workers loaded: {seen}")
    # The router's number is the worker's own num_tokens.
    for w in a.workers:
        own = http("GET", w + "/get_load")
        assert own[0]["num_reqs"] >= 1, own
        assert own[0]["num_tokens"] > 0, own
    # Let them go: abort every generation on both workers.
    for w in a.workers:
        http("POST", w + "/abort_request", {"abort_all": True})
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


TESTS = [test_chat, test_streaming_chat, test_completions, test_responses, test_generate,
         test_load_reaches_the_router]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--router", required=True)
    p.add_argument("--workers", nargs="+", required=True)
    p.add_argument("--model", default="dsv4-tiny")
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.router + "/v1", api_key="none", max_retries=0)
    run_tests("sglang-router", TESTS, client, a.model, a)

if __name__ == "__main__":
    main()
