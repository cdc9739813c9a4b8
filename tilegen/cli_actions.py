"""The CLI's back half: -o OUT.so|.o|.a [--header H] and --run (the stages themselves are
printed from the table in tilegen/stages.py)."""

from __future__ import annotations

import time
import zlib

import numpy as np

from kina_frontend.diagnostics import KinaError, Source
from kina_frontend.tensor_ir import Function, Program

from . import config
from .run_inputs import format_seconds, placeholder_values
from .runtime import IdOutOfRangeError


def run_backend_stages(plans: list, program: Program | None, source: Source, args,
                       started: float) -> int:
    """-o OUT [--header H] and --run, from the planned kernels (the `loops` stage). Without
    a tensor program (a .loops file), --run runs a kernel directly."""
    if args.output and "obj" not in args.emit:  # --emit obj -o FILE wrote the object itself
        from .library import write_library

        write_library(plans, args.output, args.header, source.name)
        elapsed = time.perf_counter() - started
        header = f" and {args.header}" if args.header else ""
        print(f"wrote {args.output}{header} ({len(plans)} function(s), "
              f"{format_seconds(elapsed)})")
    if args.run and program is None:
        from .loopfile import run_kernel

        return run_kernel(plans, args.function, args.seed)
    if args.run:
        return _run_main(program, args.seed, args.target)
    return 0


def _id_error(error: IdOutOfRangeError, function: Function, name: str) -> KinaError:
    """An id that left its range while --run ran @main, as a diagnostic at the op."""
    site = error.site
    span = next((op.span for op in function.body
                 if op.op == site.op and op.span is not None and str(op.span) == site.location),
                None)
    where = f"argument '{site.ids_argument}'" if site.ids_argument else \
        "a computed ids tensor"
    notes = ("--run draws each placeholder's ids from [0, n) for the op that reads it; ids "
             "computed from them (here by arithmetic or argmax) can leave that range",)
    return KinaError("run", f"@{name}: '{site.op}' id {error.value} at position "
                     f"{list(error.position)} of {where} is out of range [0, {site.limit})",
                     span, notes)


def _run_main(program: Program, seed: int, target: str | None = None) -> int:
    from kina_frontend.transforms import inline_calls

    from .api import compile_program

    main = program.main
    if main is None:
        raise KinaError("name", "--run needs an @main function", None)
    inlined = inline_calls(program, main, config.load().max_inlined_ops)
    try:
        inputs = placeholder_values(inlined, seed)
    except MemoryError:
        raise KinaError("run", f"@{main.name}: not enough memory for its placeholder values",
                        main.span) from None
    started = time.perf_counter()
    function = getattr(compile_program(program, names=(main.name,), target=target), main.name)
    compiled = time.perf_counter()
    try:
        outputs = function(*inputs)
    except IdOutOfRangeError as error:
        raise _id_error(error, inlined, main.name) from None
    except MemoryError as error:
        raise KinaError("run", f"@{main.name}: {error}", main.span) from None
    finished = time.perf_counter()
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    from kina_frontend.transforms import placeholders_to_params

    # Name the results by the @main's own bindings (inlining renames the values).
    named = placeholders_to_params(main).results
    print(f"ran @{main.name} with {len(inputs)} placeholder(s) (seed {seed}): compiled in "
          f"{format_seconds(compiled - started)}, ran in {format_seconds(finished - compiled)}")
    for value, array in zip(named, outputs, strict=True):
        crc = zlib.crc32(np.ascontiguousarray(array).tobytes())
        total = float(np.sum(array, dtype=np.float64))
        print(f"  {value.name}: {value.type}  sum={total:.9g}  crc32={crc:08x}")
    return 0
