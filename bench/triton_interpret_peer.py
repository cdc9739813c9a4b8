"""The TRITON_INTERPRET=1 peer of B7, as a child process (the variable must be set before
triton is imported): `python bench/triton_interpret_peer.py <repository>` builds the small
B7 cases and answers one line per request on stdin:
`run <case>` runs it once and prints `ok`; `save <case> <path>` runs it and saves the output
with torch.save, then prints `ok`. The parent times the round trip (a pipe write and read,
microseconds against the interpreter's milliseconds)."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, sys.argv[1])  # before triton: its entry points import our backend

    import torch

    from bench.triton_cases import SMALL

    cases = {}
    for line in sys.stdin:
        command, name, *rest = line.rstrip("\n").split("\t")
        if name not in cases:
            cases[name] = SMALL[name]()
        output = cases[name].kernel()
        if command == "save":
            torch.save(output, rest[0])
        print("ok", flush=True)
