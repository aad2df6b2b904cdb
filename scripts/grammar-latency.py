#!/usr/bin/env python3
"""What a constrained-decoding grammar costs a request: the median latency of one-token
/v1/completions requests without a grammar and under a regex, llama.cpp's json.gbnf and a
structural tag, against a running `dsv4 serve`.

Usage: scripts/grammar-latency.py [BASE_URL] [REQUESTS]   (default http://127.0.0.1:8000, 30)

Each case sends the same body REQUESTS times after one warm-up request, so with
`server.grammar_cache` on, every timed request after the first compile is a cache hit; run the
server with `--set server.grammar_cache=0` to time a compile per request. Prints one JSON
object: case → median milliseconds. Standard library only.
"""

import json
import statistics
import sys
import time
import urllib.request

JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<function="],
        "tags": [
            {
                "begin": "<function=get_weather>",
                "content": {"type": "json_schema", "json_schema": WEATHER},
                "end": "</function>",
            }
        ],
    },
}

CASES = {
    "plain": {},
    "regex": {"regex": "[A-Z]{3}-[0-9]{3}"},
    "json.gbnf": {"ebnf": JSON_GBNF},
    "structural_tag": {"response_format": TAG},
}


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]

    def post(body):
        req = urllib.request.Request(
            base + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        urllib.request.urlopen(req).read()
        return time.perf_counter() - start

    out = {}
    for name, extra in CASES.items():
        body = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0, **extra}
        post(body)
        times = [post(body) for _ in range(requests)]
        out[name] = round(statistics.median(times) * 1000, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
