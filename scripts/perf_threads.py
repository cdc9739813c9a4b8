#!/usr/bin/env python3
"""Where each thread of a compiled Kina function spends its time, by Linux `perf` samples
(ad hoc; not a benchmark). Runs the function in a loop on random inputs in a child
process with TILEGEN_PERF_MAP=1 (tilegen/perfmap.py names the JIT code), attaches
`perf record` to it for a few seconds, and prints per thread the share of its samples in
each function: the kernel, its parallel regions (`kina.f.par1`) and micro-kernels, and
the OpenMP runtime, where a thread that waits at a region's join spins.

    python scripts/perf_threads.py examples/bench/matmul_bf16.kina matmul_bf16_333x1000x777

A VM without a PMU samples on the software clock (`-e cpu-clock`, the default here),
which attributes a stalled instruction's time to the one after it. Needs `perf`
(linux-tools) and the permission to attach to a child (root, or perf_event_paranoid <= 1).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import os, sys, time
import numpy as np
import tilegen
from tilegen.runtime import program_of

path, name, ready, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
module = tilegen.compile_file(path)
function = getattr(module, name)
rng = np.random.default_rng(0)
args = []  # ids as zeros (in range of any table), floats standard normal
for _, dtype, shape in program_of(module).signatures[name].params:
    if dtype.kind in "iub":
        args.append(np.zeros(shape, dtype))
    else:
        args.append(rng.standard_normal(shape).astype(dtype))
function(*args)
open(ready, "w").write("ready")
end = time.perf_counter() + seconds
calls = 0
while time.perf_counter() < end:
    function(*args)
    calls += 1
print(f"{calls} calls", file=sys.stderr)
"""


def shares(script_output: str) -> dict[str, collections.Counter]:
    """Samples per thread and symbol from `perf script -F tid,ip,sym,dso` lines (perf
    resolves symbols only with the ip field; code without one is named by its library)."""
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in script_output.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        rest = fields[2:]
        library = rest.pop()[1:-1] if rest and rest[-1].startswith("(") else ""
        symbol = " ".join(rest)
        if not symbol or symbol == "[unknown]":
            symbol = f"[{os.path.basename(library) or 'unknown'}]"
        per_thread[fields[0]][symbol] += 1
    return per_thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kina", type=Path)
    parser.add_argument("function")
    parser.add_argument("--seconds", type=float, default=4.0, help="sampling time")
    parser.add_argument("--top", type=int, default=8, help="functions shown per thread")
    options = parser.parse_args()
    perf = shutil.which("perf")
    if perf is None:
        print("perf_threads: no `perf` on PATH (apt-get install linux-tools-generic)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        ready = Path(scratch) / "ready"
        data = Path(scratch) / "perf.data"
        env = dict(os.environ, TILEGEN_PERF_MAP="1")
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(options.kina),
                                  options.function, str(ready), str(options.seconds + 3)],
                                 env=env)
        try:
            while not ready.exists():
                if child.poll() is not None:
                    print("perf_threads: the function failed before its loop",
                          file=sys.stderr)
                    return 1
                time.sleep(0.1)
            subprocess.run([perf, "record", "-q", "-o", str(data), "-p", str(child.pid),
                            "--", "sleep", str(options.seconds)], check=True,
                           stdout=subprocess.DEVNULL)
        finally:
            child.wait()
        listing = subprocess.run([perf, "script", "-i", str(data), "-F", "tid,ip,sym,dso"],
                                 check=True, capture_output=True, text=True).stdout
    for thread, counts in sorted(shares(listing).items()):
        total = sum(counts.values())
        print(f"thread {thread}: {total} samples")
        for symbol, count in counts.most_common(options.top):
            print(f"  {100 * count / total:5.1f} %  {symbol}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
