"""`python -m tilegen.compile FILE.kina` -- compile a Kina program, print any stage, run @main.

The stages, in pipeline order, are the table in tilegen/stages.py (`--list-stages` prints
their names; each prints with `--emit NAME`). FILE may also be a `.loops` file (the text
`--emit loops` prints), which enters the pipeline at the `loops` stage.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kina_frontend import KinaError


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .stages import STAGES

    # The console script is `tilegen`; `python -m tilegen.compile` runs this file.
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = argparse.ArgumentParser(
        prog="tilegen" if invoked == "tilegen" else "python -m tilegen.compile",
        description="Compile a Kina program with tilegen. A bare name such as "
                    "'storylm0_forward.kina' resolves against the bundled examples.")
    parser.add_argument("file", nargs="?",
                        help="a .kina file, the name of a bundled example, or a .loops file "
                             "(loop IR as --emit loops prints it)")
    parser.add_argument("--emit", action="append", choices=[s.name for s in STAGES],
                        default=[], metavar="STAGE",
                        help="print a pipeline stage (repeatable): " +
                             "; ".join(f"{s.name}: {s.prints}" for s in STAGES))
    parser.add_argument("--list-stages", action="store_true",
                        help="print the stage names, one per line, in pipeline order")
    parser.add_argument("--function", help="restrict the per-function stages (prepared "
                                           "onwards), -o and --run to one function")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_stages:
        from .stages import NAMES

        print("\n".join(NAMES))
        return 0
    if args.file is None:
        parser.error("the following arguments are required: file")
    try:
        return _compile(args)
    except KinaError as error:
        print(error.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _compile(args: argparse.Namespace) -> int:
    from kina_frontend import load_source, resolve_path
    from kina_frontend.report import derived_names, shown_type

    from . import config, stages

    started = time.perf_counter()
    path = resolve_path(args.file)
    source = load_source(path)
    if args.header and not args.output:
        raise KinaError("io", "--header needs -o (the library the header describes)", None)
    names = (args.function,) if args.function else None
    ctx = stages.context(source, names, options=config.load(args.target))
    wanted = set(args.emit)
    if "obj" in wanted and not args.output and sys.stdout.isatty():
        raise KinaError("io", "--emit obj writes object code: give -o FILE (or redirect "
                        "standard output)", None)
    from_loops = str(path).endswith(".loops")
    if from_loops:
        from .loopfile import plans_from_text

        start, artifact = "loops", plans_from_text(source, names, ctx.options)
    else:
        # The front end always runs to the tensor IR: its diagnostics do not depend on what
        # is printed.
        start, artifact = stages.START, None
        wanted.add("tensor")
    if args.output or args.run:
        wanted.add("loops")
    artifacts = {start: artifact}
    for stage, result in stages.run_stages(wanted, ctx, start, artifact):
        artifacts[stage.name] = result
        if stage.name in args.emit:
            _print_stage(stage, stage.show(result, ctx), args)
    if (args.output and "obj" not in args.emit) or args.run:
        from .cli_actions import run_backend_stages

        plans = list(artifacts["loops"])
        return run_backend_stages(plans, artifacts.get("tensor"), source, args, started)
    if not args.emit and not from_loops:
        checked, program = artifacts["types"], artifacts["tensor"]
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
    elif not args.emit:
        print(f"{source.name}: {len(artifact)} kernel(s) of loop IR, verified; --emit, -o or "
              f"--run to compile them")
    return 0


def _print_stage(stage, shown: str | bytes, args: argparse.Namespace) -> None:
    if not stage.binary:
        sys.stdout.write(shown)
        return
    sys.stdout.flush()
    if args.output:
        with open(args.output, "wb") as handle:
            handle.write(shown)
        print(f"wrote {args.output} ({len(shown)} bytes of object code)")
    else:
        sys.stdout.buffer.write(shown)


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
