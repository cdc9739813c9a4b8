"""Cold-process compile probe for B6: run in a fresh interpreter, print one JSON line.

    python bench/compile_probe.py tilegen PATH.kina
        import_s:  `import tilegen.api` (the compiler, kina_frontend, llvmlite, sympy)
        compile_s: tilegen.compile_file(PATH) and every function turned into machine code
                   (source to callables; tilegen's JIT is lazy per function, so this forces it)
    python bench/compile_probe.py torch.compile|jax|numba
        The StoryLM-0 forward (T = 4, fixture weights) in that peer:
        import_s:  importing the peer library and the bench's model code for it
        compile_s: the first call (trace + compile + one tiny run), as a user meets it

Inputs are built before the clock starts. Nothing here reads the benchmark's caches; the caller
points peers' on-disk caches (TorchInductor) at an empty folder so each probe is cold.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_tilegen(path: str) -> dict:
    start = time.perf_counter()
    import tilegen.api
    imported = time.perf_counter()
    module = tilegen.api.compile_file(path, jit=True)
    front = time.perf_counter()
    functions = tilegen.program_of(module).functions  # forces per-function machine code
    done = time.perf_counter()
    return {"import_s": imported - start, "compile_s": done - imported,
            "frontend_s": front - imported, "machine_code_s": done - front,
            "functions": len(functions)}


def _storylm0_t4_inputs():
    import numpy as np

    from bench import storylm_data
    model = storylm_data.storylm0(4)
    return model, np.array([[1, 4, 2, 6]], dtype=np.int64)


def probe_peer(peer: str) -> dict:
    model, ids = _storylm0_t4_inputs()
    args = model.forward_args(ids)
    start = time.perf_counter()
    if peer == "torch.compile":
        import torch

        from bench.peers import torch_storylm
        tensors = torch_storylm.tensors(*args)
        imported = time.perf_counter()

        def forward(*inputs):
            return torch_storylm.forward(*inputs, model.heads)

        torch.compile(forward, dynamic=False)(*tensors)
    elif peer == "jax":
        from bench.peers import jax_storylm
        arrays = jax_storylm.device(*args)
        imported = time.perf_counter()
        jax_storylm.jit_forward(model.heads)(*arrays).block_until_ready()
    elif peer == "numba":
        import numpy as np

        from bench.peers import numba_storylm
        out = np.empty((1, ids.shape[1], model.vocab), np.float32)
        imported = time.perf_counter()
        numba_storylm.forward_into(*args, model.heads, out)  # type: ignore[call-arg]
    else:
        raise SystemExit(f"unknown peer {peer!r}")
    done = time.perf_counter()
    return {"import_s": imported - start, "compile_s": done - imported}


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(REPO))  # the bench package, for the peers' model code
    if len(argv) == 2 and argv[0] == "tilegen":
        result = probe_tilegen(argv[1])
    elif len(argv) == 1:
        result = probe_peer(argv[0])
    else:
        raise SystemExit(__doc__)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
