"""A child process: `TRITON_INTERPRET=1 python -m tests.tritongen <folder> <case>...` runs
saved cases on the interpreter; without the variable, on tilegen."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.tritongen.running import run_cases

if __name__ == "__main__":
    # (TRITON_INTERPRET is read when triton is imported: nothing above imports it)
    mode = "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "tilegen"
    if mode == "tilegen":
        import triton  # noqa: F401  (before registering: the backend plugs into it)

        import tilegen.triton_backend

        tilegen.triton_backend.register()
    run_cases(Path(sys.argv[1]), sys.argv[2:], mode)
