"""The CLI's back half: --emit loops|llvm|asm|mlir, -o OUT.so, --run."""

from __future__ import annotations

import time
import zlib

import numpy as np

from kina_frontend.diagnostics import KinaError, Source
from kina_frontend.tensor_ir import Function, Program
from kina_frontend.types import DType

from .loopir import format_kernel
from .pipeline import assembly, codegen, plan_program, to_llvm


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
    plans = plan_program(program, names)
    if "loops" in args.emit:
        for plan in plans:
            print(format_kernel(plan.kernel))
            print()
    builder_module = codegen(plans)
    if "llvm" in args.emit:
        print(to_llvm(builder_module, optimize_module=True), end="")
    if "asm" in args.emit:
        print(assembly(to_llvm(builder_module)), end="")
    if args.output:
        from .runtime import link_shared_library

        link_shared_library(to_llvm(builder_module, pic=True), args.output)
        elapsed = (time.perf_counter() - started) * 1e3
        print(f"wrote {args.output} ({len(plans)} function(s), {elapsed:.1f} ms)")
    if args.run:
        return _run_main(program, args.seed)
    return 0


def placeholder_values(function: Function, seed: int) -> list[np.ndarray]:
    """Deterministic inputs for an @main's placeholders, in order: floats are standard
    normal draws from numpy.random.default_rng(seed + k) for placeholder k; ids are drawn
    uniformly from [0, n) where n is the smallest table/class count of any gather or
    one_hot that reads them (8 when none does); BOOL values are true with probability 1/2."""
    limits = id_limits(function)
    values = []
    for op in function.body:
        if op.op != "placeholder":
            continue
        rng = np.random.default_rng(seed + op.attr("index"))
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
    """For each I64 value a gather or one_hot reads: the smallest row or class count."""
    limits: dict[str, int] = {}
    for op in function.body:
        if op.op == "gather":
            name, limit = op.operands[1].name, op.operands[0].type.concrete_shape[0]
        elif op.op == "one_hot":
            name, limit = op.operands[0].name, int(op.attr("n"))
        else:
            continue
        limits[name] = min(limit, limits.get(name, limit))
    return limits


def _run_main(program: Program, seed: int) -> int:
    from kina_frontend.transforms import inline_calls

    from .api import compile_program

    main = program.main
    if main is None:
        raise KinaError("name", "--run needs an @main function", None)
    inlined = inline_calls(program, main)
    inputs = placeholder_values(inlined, seed)
    module = compile_program(program, names=(main.name,))
    started = time.perf_counter()
    outputs = getattr(module, main.name)(*inputs)
    elapsed = (time.perf_counter() - started) * 1e6
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    from kina_frontend.transforms import placeholders_to_params

    # Name the results by the @main's own bindings (inlining renames the values).
    named = placeholders_to_params(main).results
    print(f"ran @{main.name} with {len(inputs)} placeholder(s) (seed {seed}) in "
          f"{elapsed:.1f} us")
    for value, array in zip(named, outputs, strict=True):
        crc = zlib.crc32(np.ascontiguousarray(array).tobytes())
        total = float(np.sum(array, dtype=np.float64))
        print(f"  {value.name}: {value.type}  sum={total:.9g}  crc32={crc:08x}")
    return 0
