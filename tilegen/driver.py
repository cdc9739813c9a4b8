"""The CLI's back half: --emit loops|llvm|asm|mlir, -o OUT.so|.o|.a [--header H], --run."""

from __future__ import annotations

import time
import zlib

import numpy as np

from kina_frontend.diagnostics import KinaError, Source
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Function, Program
from kina_frontend.types import DType

from . import config
from .loopir import format_kernel
from .pipeline import assembly, codegen, plan_program, to_llvm
from .runtime import IdOutOfRangeError
from .tuning import tile_chooser


def run_backend_stages(program: Program, source: Source, args, started: float) -> int:
    names = None
    if args.function:
        if args.function not in program.function_names:
            raise KinaError("name", f"--function: no function '{args.function}' in "
                            f"{source.name} (it has: {', '.join(program.function_names)})", None)
        names = (args.function,)
    if "mlir" in args.emit:
        from .mlir import emit_mlir

        print(emit_mlir(program), end="")
    needs_code = any(s in args.emit for s in ("loops", "llvm", "asm")) or args.output or args.run
    if not needs_code:
        return 0
    options = config.load(args.target)
    plans = plan_program(program, names, options, tile_chooser(options))
    if "loops" in args.emit:
        for plan in plans:
            print(format_kernel(plan.kernel))
            print()
    if "llvm" in args.emit or "asm" in args.emit:
        builder_module = codegen(plans)
        if "llvm" in args.emit:
            print(to_llvm(builder_module, options.target, optimize_module=True), end="")
        if "asm" in args.emit:
            print(assembly(to_llvm(builder_module, options.target), options.target), end="")
    if args.output:
        from .library import write_library

        write_library(plans, args.output, args.header, source.name)
        elapsed = time.perf_counter() - started
        header = f" and {args.header}" if args.header else ""
        print(f"wrote {args.output}{header} ({len(plans)} function(s), "
              f"{format_seconds(elapsed)})")
    if args.run:
        return _run_main(program, args.seed, args.target)
    return 0


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: 850 ns, 12.3 us, 4.5 ms, 1.25 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.0f} ns"


def placeholder_values(function: Function, seed: int) -> list[np.ndarray]:
    """Deterministic inputs for an @main's placeholders, in order: floats are standard
    normal draws from numpy.random.default_rng(seed + k) for placeholder k; ids are drawn
    uniformly from [0, n) where n is the smallest bound of any op that reads them (a
    gather's table rows, a scatter_add's rows, a one_hot's class count; 8 when none
    does); BOOL values are true with probability 1/2. A seed + k below 0 is a diagnostic
    at placeholder k (NumPy seeds are non-negative)."""
    limits = id_limits(function)
    values = []
    for op in function.body:
        if op.op != "placeholder":
            continue
        number = op.attr("index")
        if seed + number < 0:
            raise KinaError("run", f"--seed {seed} gives placeholder {number} the NumPy seed "
                            f"{seed + number}, and seeds must be non-negative", op.span,
                            ("placeholder k is drawn with seed + k: use --seed 0 or more",))
        rng = np.random.default_rng(seed + number)
        ttype = op.result.type
        shape = ttype.concrete_shape
        if ttype.dtype.is_float:
            values.append(rng.standard_normal(shape).astype(ttype.dtype.numpy))
        elif ttype.dtype == DType.BOOL:
            values.append(rng.random(shape) < 0.5)
        else:
            values.append(rng.integers(0, limits.get(op.result.name, 8), size=shape,
                                       dtype=np.int64))
    return values


def id_limits(function: Function) -> dict[str, int]:
    """For each I64 value an op reads as ids (its OpDef's `ids_bound`): the smallest bound."""
    limits: dict[str, int] = {}
    for op in function.body:
        definition = REGISTRY.get(op.op)
        if definition is None or definition.ids_bound is None:
            continue
        position, limit = definition.ids_bound(op)
        name = op.operands[position].name
        limits[name] = min(limit, limits.get(name, limit))
    return limits


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
