#!/usr/bin/env python3
"""Count the SASS instructions on the fast path of a kernel's main loop, from a CUBIN.

The decode GEMVs are issue-bound on an H200 (docs/performance.md), so the instructions a loop
iteration issues per weight is the number their kernel changes are judged by before a GPU can
time them. For each kernel named, this finds the smallest loop (a backward branch) with at
least 16 accumulating instructions (DFMA in an f64-sum CUBIN, else FFMA, or FADD before the
f32 sums were fused) and no warp shuffle,
and the path through it, head to back edge, with the most of them: the fast path (a chunk of
every column decoded and added), which the rare out-of-line routes leave. It prints the loop's
size, the path's length and its opcode mix.

    python3 -m pip install nvidia-cuda-nvdisasm      # nvdisasm (or set NVDISASM, or PATH)
    dsv4 kernels compile --arch 9.0 --sums both --cache-dir /tmp/kc
    python3 backends/cuda-sm120/sass-fast-path.py /tmp/kc/cuda-kernels/sm_90-f64-*.cubin \\
        linear_fp8_r1 linear_mxfp4_g1

Divide the path's length by the weights one iteration covers for instructions per weight: the
loop adds a chunk of each column in every slot of its ring of loads (lin_r1.cuh: 2 slots, or 4
for depths 2 and 3), so 2 × (2 × 16) for the default fp8 kernel, 2 × (4 × 32) for MXFP4's.

Under each kernel it lists where the path's 64/128-bit global loads are first touched: `+N`
path instructions after the load, or `next iteration`. Touching a register a load has yet to
fill stalls the warp, so a weight load touched a few dozen instructions after it hides little
memory latency.
"""

import collections
import functools
import glob
import os
import re
import shutil
import subprocess
import sys


def nvdisasm():
    """The nvdisasm binary: $NVDISASM, PATH, or the nvidia-cuda-nvdisasm wheel."""
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the namespace package the NVIDIA wheels install into

        for root in nvidia.__path__:
            hits = glob.glob(os.path.join(root, "*", "bin", "nvdisasm"))
            if hits:
                return hits[0]
    except ImportError:
        pass
    sys.exit("nvdisasm not found: python3 -m pip install nvidia-cuda-nvdisasm, or set NVDISASM")


BRANCH = re.compile(r"BRA .*`\((\.L_x_\d+)\)")


def opcode(ins):
    """The opcode of an instruction, without its predicate and modifiers."""
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def functions(cubin):
    """{kernel: (labels {name: index}, instructions)} of every function in `cubin`."""
    out = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True)
    result = {}
    for sec in re.split(r"^\.text\.", out.stdout, flags=re.M)[1:]:
        name = sec.split(":", 1)[0]
        labels, insns = {}, []
        for line in sec.splitlines():
            m = re.match(r"^(\.L_x_\d+):", line)
            if m:
                labels[m.group(1)] = len(insns)
                continue
            m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
            if m:
                insns.append(m.group(1).strip())
        result[name] = (labels, insns)
    return result


def fast_path(labels, insns):
    """(loop start, loop end, path of instruction indices, accumulating opcode), or None."""
    ops = {opcode(x) for x in insns}
    acc = next((op for op in ("DFMA", "FFMA", "FADD") if op in ops), "FADD")
    loops = []
    for i, ins in enumerate(insns):
        m = BRANCH.search(ins)
        if m and labels.get(m.group(1), len(insns)) <= i:
            s = labels[m.group(1)]
            body = insns[s : i + 1]
            if sum(opcode(x) == acc for x in body) >= 16 and not any("SHFL" in x for x in body):
                loops.append((i - s, s, i))
    if not loops:
        return None
    _, s, e = min(loops)

    @functools.lru_cache(maxsize=None)
    def best(pc):
        # (accumulating instructions, path) of the best path from pc to the back edge e
        if pc == e:
            return (0, (pc,))
        x = insns[pc]
        m = BRANCH.search(x)
        if m:
            succ = [t for t in [labels[m.group(1)]] if t != s]
            if x.startswith("@"):
                succ.append(pc + 1)
        elif opcode(x) == "EXIT" and not x.startswith("@"):
            return None
        else:
            succ = [pc + 1]
        paths = [best(t) for t in succ if pc < t <= e]
        paths = [p for p in paths if p]
        if not paths:
            return None
        n, path = max(paths, key=lambda p: (p[0], -len(p[1])))
        return (n + (opcode(x) == acc), (pc,) + path)

    sys.setrecursionlimit(max(10000, 4 * len(insns)))
    found = best(s)
    return (s, e, found[1], acc) if found else None


WIDE_LOAD = re.compile(r"^(?:@!?P\w+\s+)?LDG?\.E\.(128|64)\S*\s+R(\d+),")


def load_waits(insns, path):
    """For each 64/128-bit global load on the path: how many path instructions after it the
    first one that touches its destination registers comes, or None when none does before the
    back edge (its result is used in a later iteration). Touching a register a load has yet to
    fill stalls the warp until the load returns: a load used in its own iteration keeps no
    memory latency hidden behind the rest of the loop."""
    waits = []
    for k, p in enumerate(path):
        m = WIDE_LOAD.match(insns[p])
        if not m:
            continue
        first = int(m.group(2))
        regs = {f"R{first + i}" for i in range(int(m.group(1)) // 32)}
        wait = None
        for d, q in enumerate(path[k + 1 :], 1):
            body = insns[q].split(None, 1)
            ops = body[1] if len(body) > 1 and not body[0].startswith("@") else insns[q]
            if regs & set(re.findall(r"\bR\d+\b", ops)):
                wait = d
                break
        waits.append(wait)
    return waits


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cubin, names = sys.argv[1], sys.argv[2:]
    funcs = functions(cubin)
    for name in names:
        if name not in funcs:
            print(f"{name}: not in {cubin}")
            continue
        labels, insns = funcs[name]
        found = fast_path(labels, insns)
        if not found:
            print(f"{name}: no accumulating loop")
            continue
        s, e, path, acc = found
        mix = collections.Counter(opcode(insns[p]) for p in path)
        print(
            f"{name}: loop of {e - s + 1} instructions, fast path {len(path)} "
            f"({mix[acc]} {acc}): " + ", ".join(f"{k} {v}" for k, v in mix.most_common(10))
        )
        waits = load_waits(insns, path)
        if waits:
            said = ["next iteration" if w is None else f"+{w}" for w in waits]
            print(f"  weight loads on the path, first touched: {', '.join(said)}")


if __name__ == "__main__":
    main()
