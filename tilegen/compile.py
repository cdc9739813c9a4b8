"""`python -m tilegen.compile FILE.kina` -- compile a Kina program, print any stage, run @main.

Stages, in pipeline order (each printable with --emit):
  tokens  ast  types  tensor  loops  llvm  asm  mlir
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kina_frontend import KinaError

STAGES = ("tokens", "ast", "types", "tensor", "loops", "llvm", "asm", "mlir")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    # The console script is `tilegen`; `python -m tilegen.compile` runs this file.
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = argparse.ArgumentParser(
        prog="tilegen" if invoked == "tilegen" else "python -m tilegen.compile",
        description="Compile a Kina program with tilegen. A bare name such as "
                    "'storylm0_forward.kina' resolves against the bundled examples.")
    parser.add_argument("file", help="a .kina file, or the name of a bundled example")
    parser.add_argument("--emit", action="append", choices=STAGES, default=[],
                        help="print a pipeline stage (repeatable)")
    parser.add_argument("--function", help="restrict --emit loops/llvm/asm to one function")
    parser.add_argument("-o", "--output",
                        help="write a library: a shared library (.so), an object (.o) or a "
                             "static library (.a), with the C ABI of docs/aot.md")
    parser.add_argument("--header", help="with -o: also write the C header to this path")
    parser.add_argument("--run", action="store_true",
                        help="run @main with deterministic placeholder values and print each "
                             "result's shape and checksum")
    parser.add_argument("--seed", type=int, default=0, help="seed for --run placeholder values")
    parser.add_argument("--target", default=None,
                        help="generate code for this CPU: host (default, or TILEGEN_TARGET), "
                             "x86-64-v3, skylake-avx512, aarch64-linux-gnu; running needs one "
                             "this machine can execute")
    parser.add_argument("--version", action="version",
                        version=f"tilegen {__version__} (Kina frontend)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _compile(args)
    except KinaError as error:
        print(error.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _compile(args: argparse.Namespace) -> int:
    from kina_frontend import ast, load_source, parse_source, resolve_path
    from kina_frontend.checker import check_module, specialize
    from kina_frontend.lexer import tokenize
    from kina_frontend.report import derived_names, shown_type, types_report
    from kina_frontend.tensor_ir import format_program

    started = time.perf_counter()
    path = resolve_path(args.file)
    source = load_source(path)
    if "tokens" in args.emit:
        for token in tokenize(source):
            print(token)
    module = parse_source(source)
    if "ast" in args.emit:
        print(ast.dump(module))
    checked = check_module(module)
    if "types" in args.emit:
        print(types_report(checked, source.name))
    program = specialize(checked)
    if "tensor" in args.emit:
        print(format_program(program, with_locations=True), end="")
    if args.header and not args.output:
        raise KinaError("io", "--header needs -o (the library the header describes)", None)
    backend_stages = [s for s in args.emit if s in ("loops", "llvm", "asm", "mlir")]
    if backend_stages or args.output or args.run:
        from .driver import run_backend_stages

        return run_backend_stages(program, source, args, started)
    if not args.emit:
        checked_at = time.perf_counter()
        print(f"{source.name}: {len(program.functions)} function(s), "
              f"{len(checked.obligations)} shape obligations proved "
              f"({(checked_at - started) * 1e3:.1f} ms)")
        derived = derived_names(checked)  # print `D`, as written, not `Dh*H`
        for function in checked.program.functions:
            params = ", ".join(shown_type(p.type, derived) for p in function.params)
            results = ", ".join(shown_type(v.type, derived) for v in function.results)
            print(f"  {'@main ' if function.is_main else ''}{function.name}({params}) "
                  f"-> ({results})")
        _compile_natively(program, source, args.target)
    return 0


def _compile_natively(program, source, target: str | None = None) -> None:
    """The default action: lower, schedule and JIT-compile every function, and say so
    (through the disk cache when TILEGEN_CACHE_DIR is set, as compile_file does)."""
    from . import config
    from .api import planned
    from .loopir import Gemm
    from .runtime import jit_module, program_of

    started = time.perf_counter()  # after the backend's imports, which are not compiling
    settings = config.load(target)
    settings.target.check_runs_on_host("JIT compile (the default action; --emit asm "
                                       "shows the code)")
    plans, disk, key = planned(source.name, source.text, lambda: program, settings, True)
    planned_at = time.perf_counter()
    program_of(jit_module(plans, settings.profile, disk, key)).functions  # noqa: B018
    compiled = time.perf_counter()
    cached = f", disk cache {settings.cache_dir}" if disk is not None else ""
    print(f"lowered to {len(plans)} loop-nest kernel(s) ({(planned_at - started) * 1e3:.1f} "
          f"ms), JIT-compiled for {settings.target.cpu} ({(compiled - planned_at) * 1e3:.1f} ms"
          f"{cached})")
    for plan in plans:
        kernel = plan.kernel
        loops = list(_loops(kernel.body))
        vector = sum(1 for loop in loops if loop.kind == "vector")
        parallel = sum(1 for loop in loops if loop.kind == "parallel" or loop.threads > 1)
        gemms = sum(1 for s in kernel.body if isinstance(s, Gemm))
        print(f"  {kernel.name}: {len(kernel.body)} loop nest(s), {vector} vector loop(s), "
              f"{parallel} parallel, {gemms} packed matmul(s), "
              f"{sum(1 for b in kernel.buffers if b.role == 'temp')} temporaries")


def _loops(stmts):
    from .loopir import For

    for stmt in stmts:
        if isinstance(stmt, For):
            yield stmt
            yield from _loops(stmt.body)


if __name__ == "__main__":
    sys.exit(main())
