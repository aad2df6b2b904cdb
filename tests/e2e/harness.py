"""What the end-to-end scripts share: the stop strings that keep the tiny model's noise out of
the strict DSV4 parser, an assertion that says what failed, and the runner that prints
`PASS name` / `FAIL name` per test and `LABEL: N passed, M failed` (which
crates/dsv4-cli/tests/server_e2e.rs reads)."""

import sys
import traceback

# Stop strings that end a tiny-model answer before any special token the strict DSV4 parser
# refuses in plain text (the tiny model's weights are random; it emits such tokens often).
CLEAN_STOPS = [
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜latest_reminder｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run_tests(label, tests, *args):
    """Run each test with `args`, print its outcome and the totals, and exit 1 if any failed."""
    failed = 0
    for t in tests:
        try:
            t(*args)
            print(f"PASS {t.__name__}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the next test runs
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"{label}: {len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
