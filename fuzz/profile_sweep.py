#!/usr/bin/env python3
"""Randomized profile sweep: random combinations of `--set key=value` through real dsv4 commands.

Each run picks a shipped profile, one to four keys, and for each key either a value some shipped
profile uses or an edge value (0, -1, 2^64, nan, "", ...), then runs one of `plan check`,
`generate --batch` (the engine: pools, scheduler, prefix cache), `profile explain` or
`profile export --target sglang`. Refusing a combination is fine (exit 1 with a message); a panic
(exit 101 or "panicked" on stderr), a death by signal or a run past the timeout is a bug, and the
command line is printed so it can be rerun.

    python3 fuzz/profile_sweep.py --bin target/release/dsv4 --seed 1 --runs 300

Exit status: 0 when no run was a bug, 1 otherwise. See docs/fuzzing.md.
"""
import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile

PROFILES = ["dev-cpu", "reference", "rehearsal", "prod-bf16", "prod-fp8"]
EDGE = ["0", "1", "-1", "2", "3", "7", "65", "1025", "4096", "1000000", "1000000000",
        "100000000000", "2147483648", "9223372036854775808", "18446744073709551615",
        "18446744073709551616", "1e300", "1e-300", "-0.0", "nan", "inf", "0.5", "", "true",
        "auto", "none", "x", "[]", '["kv"]', "\u00e9"]
# Keys whose values reach outside the process (ports, paths, peers) or only hold secrets.
SKIP = {"server.port", "server.host", "model.path", "disagg.bootstrap", "server.api_key"}


def shipped_values(binary):
    """Every key with the values the shipped profiles give it."""
    values = {}
    for prof in PROFILES:
        out = subprocess.run([binary, "profile", "show", "--profile", prof, "--json"],
                             capture_output=True, text=True, check=True)
        for s in json.loads(out.stdout)["settings"]:
            v = s["value"]
            text = v if isinstance(v, str) else json.dumps(v)
            values.setdefault(s["key"], set()).add(text)
    return {k: sorted(v) for k, v in values.items() if k not in SKIP}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/dsv4", help="the dsv4 binary")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"error: {args.bin} is not an executable; build it with "
                 "`cargo build --release -p dsv4-cli` or pass --bin")

    values = shipped_values(args.bin)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        batch = os.path.join(tmp, "batch.jsonl")
        with open(batch, "w") as f:
            for i, (p, n) in enumerate([("hello there", 3), ("hi", 2), ("hello there friend", 5),
                                        ("hello", 4)]):
                f.write(json.dumps({"id": f"r{i}", "prompt": p, "max_tokens": n}) + "\n")
        commands = [
            ["plan", "check", "--config", "tiny", "--batch", "3", "--prefill-rows", "8"],
            ["generate", "--batch", batch],
            ["profile", "explain"],
            ["profile", "export", "--target", "sglang"],
        ]
        exits, bugs = {}, 0
        for _ in range(args.runs):
            sets = []
            for key in rng.sample(sorted(values), rng.randint(1, 4)):
                v = rng.choice(values[key]) if rng.random() < 0.75 else rng.choice(EDGE)
                if rng.random() < 0.3 and v.lstrip("-").isdigit():
                    v = str(int(v) + rng.choice([-1, 1, 7, 63, 64, 1000]))
                sets += ["--set", f"{key}={v}"]
            argv = [args.bin] + rng.choice(commands) + ["--profile", rng.choice(PROFILES)] + sets
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
                code, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                code, err = "timeout", ""
            exits[str(code)] = exits.get(str(code), 0) + 1
            if code == "timeout" or code == 101 or (isinstance(code, int) and code < 0) \
                    or "panicked" in err:
                bugs += 1
                print(f"BUG (exit {code}): {shlex.join(argv)}\n{err[-1500:]}", flush=True)
    print(json.dumps({"runs": args.runs, "seed": args.seed, "exit_codes": exits, "bugs": bugs}))
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
