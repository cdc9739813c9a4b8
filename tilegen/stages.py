"""The compiler as one ordered table of named stages.

Each stage is a pure function from the artifact of the stage it reads (the one before it,
unless `reads` says otherwise) to its own, with a printer for `--emit NAME` and a verifier
run after it under TILEGEN_VERIFY=1 and in the tests:

    source -> tokens                       ast (from the source) -> types -> tensor
    tensor -> prepared -> lowered -> <one stage per schedule pass> -> loops -> emit-plan
    loops  -> llvm -> llvm-opt -> asm       llvm -> obj            tensor -> mlir

From `prepared` to `emit-plan` an artifact holds one item per compiled function; from
`llvm` on, one LLVM module for all of them. `loops` is the loop IR codegen takes (the last
schedule pass's output, what a `.loops` file holds); the schedule stages come from
`pipeline.SCHEDULE_PASSES`, the list the compiler itself runs. `python -m tilegen.compile
FILE --list-stages` prints the names in this order; the CLI's `--emit`, the tests
(tests/test_stages.py) and the stage table in docs/architecture.md are driven from
`STAGES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kina_frontend.diagnostics import KinaError, Source

from . import config
from .config import Config

START = "source"  # the pseudo-stage every table walk starts from: the Source of a .kina file


@dataclass(frozen=True)
class Context:
    """What every stage may read besides its input: the file, the options, the functions
    to compile (None: all) and the values given to consts."""

    source: Source
    options: Config
    names: tuple[str, ...] | None = None
    consts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Stage:
    name: str
    prints: str  # what `--emit NAME` prints, for --help and the docs
    run: Callable[[Any, Context], Any]
    show: Callable[[Any, Context], str | bytes]
    reads: str = ""  # the stage whose artifact `run` takes ("": the one before)
    verify: Callable[[Any, Context], None] | None = None
    binary: bool = False  # `show` gives bytes (written with -o)


# ---- the stages' functions --------------------------------------------------------------------

def _tokens(source: Source, ctx: Context):
    from kina_frontend.lexer import tokenize

    return tuple(tokenize(source))


def _ast(source: Source, ctx: Context):
    from kina_frontend import parse_source

    return parse_source(source)


def _types(module, ctx: Context):
    from kina_frontend.checker import check_module

    return check_module(module, dict(ctx.consts))


def _show_types(checked, ctx: Context) -> str:
    from kina_frontend.report import types_report

    return types_report(checked, ctx.source.name) + "\n"


def _tensor(checked, ctx: Context):
    from kina_frontend.checker import specialize

    program = specialize(checked)
    if ctx.names is not None:
        missing = [n for n in ctx.names if n not in program.function_names]
        if missing:
            raise KinaError("name", f"--function: no function '{missing[0]}' in "
                            f"{ctx.source.name} (it has: {', '.join(program.function_names)})",
                            None)
    return program


def _verify_tensor(program, ctx: Context) -> None:
    from kina_frontend.verify import check_program

    check_program(program)


def _prepared(program, ctx: Context):
    from .pipeline import prepare

    names = ctx.names if ctx.names is not None else program.function_names
    return tuple(prepare(program, name, ctx.options) for name in names)


def _verify_prepared(functions, ctx: Context) -> None:
    from .pipeline import verify_prepared

    for function in functions:
        verify_prepared(function)


def _show_prepared(functions, ctx: Context) -> str:
    from kina_frontend.tensor_ir import format_function

    return "".join(format_function(f, with_locations=True) + "\n" for f in functions)


def _lowered(functions, ctx: Context):
    from .pipeline import KernelPlan, lower
    from .tuning import tile_chooser

    choose_tiles = tile_chooser(ctx.options)
    return tuple(KernelPlan(f, lower(f, ctx.options, choose_tiles), ctx.options.target,
                            ctx.options.stack_bytes) for f in functions)


def _verify_plans(name: str):
    def verify(plans, ctx: Context) -> None:
        from .loopir_verify import verify_kernel

        for plan in plans:
            verify_kernel(plan.kernel, after=name)
    return verify


def _show_kernels(plans, ctx: Context) -> str:
    from .loopir import format_kernel

    return "".join(format_kernel(plan.kernel) + "\n\n" for plan in plans)


def _schedule_pass(pass_fn):
    def run(plans, ctx: Context):
        return tuple(replace(plan, kernel=pass_fn(plan.kernel, ctx.options)) for plan in plans)
    return run


def _same(artifact, ctx: Context):
    return artifact


def _show_emit_plan(plans, ctx: Context) -> str:
    from .emitplan import annotate

    return "".join(annotate(plan.kernel) + "\n\n" for plan in plans)


def _llvm(plans, ctx: Context):
    from .pipeline import codegen

    return codegen(list(plans), profile=ctx.options.profile)


def _show_llvm(module, ctx: Context) -> str:
    from .pipeline import to_llvm

    return str(to_llvm(module, ctx.options.target, optimize_module=False))


def _verify_llvm(module, ctx: Context) -> None:
    from .pipeline import to_llvm

    to_llvm(module, ctx.options.target, optimize_module=False)  # parses and verifies it


def _llvm_opt(module, ctx: Context):
    from .pipeline import to_llvm

    return to_llvm(module, ctx.options.target)


def _asm(parsed, ctx: Context) -> str:
    from .pipeline import assembly

    return assembly(parsed, ctx.options.target)


def _obj(module, ctx: Context) -> bytes:
    from .pipeline import object_code, to_llvm

    return object_code(to_llvm(module, ctx.options.target, pic=True), ctx.options.target)


def _mlir(program, ctx: Context) -> str:
    from .mlir import emit_mlir

    return emit_mlir(program)


def _text(artifact, ctx: Context):
    return artifact


def _schedule_stages() -> tuple[Stage, ...]:
    from .pipeline import SCHEDULE_PASSES

    return tuple(Stage(name, f"the loop IR after the {name} pass (docs/loopnest.md)",
                       _schedule_pass(pass_fn), _show_kernels, verify=_verify_plans(name))
                 for name, pass_fn in SCHEDULE_PASSES)


STAGES: tuple[Stage, ...] = (
    Stage("tokens", "the token stream with line:column", _tokens,
          lambda tokens, ctx: "".join(f"{t}\n" for t in tokens), reads=START),
    Stage("ast", "the syntax tree with spans", _ast,
          lambda module, ctx: _dump_ast(module), reads=START),
    Stage("types", "each binding's type, symbolic and concrete, and every shape obligation "
          "proved", _types, _show_types),
    Stage("tensor", "the typed tensor IR (round-trips through kina_frontend.parse_ir)",
          _tensor, lambda program, ctx: _format_program(program), verify=_verify_tensor),
    Stage("prepared", "each compiled function's tensor IR after inlining, reverseMode "
          "expansion (its gradient simplified), dead-code elimination and projection before "
          "gather",
          _prepared, _show_prepared, verify=_verify_prepared),
    Stage("lowered", "the loop-nest IR as lowering builds it, before any schedule pass",
          _lowered, _show_kernels, verify=_verify_plans("lowered")),
    *_schedule_stages(),
    Stage("loops", "the scheduled loop-nest IR codegen takes (vector<16> / parallel<2> "
          "loops, gemm statements with their tiles); a .loops file starts here",
          _same, _show_kernels, verify=_verify_plans("loops")),
    Stage("emit-plan", "the loops stage with codegen's own decisions as # comments: "
          "unrolling, joint reductions, tail-tile widths (tilegen/emitplan.py)",
          _same, _show_emit_plan),
    Stage("llvm", "the LLVM IR codegen builds, before optimisation", _llvm, _show_llvm,
          reads="loops", verify=_verify_llvm),
    Stage("llvm-opt", "the LLVM IR after the O3 pipeline", _llvm_opt,
          lambda parsed, ctx: str(parsed)),
    Stage("asm", "assembly for the target CPU (--target; default: this machine's)", _asm,
          _text),
    Stage("obj", "the kernels' object code (position-independent; --emit obj -o FILE)",
          _obj, _text, reads="llvm", binary=True),
    Stage("mlir", "func/linalg/tensor/arith/math MLIR, accepted by mlir-opt-19", _mlir, _text,
          reads="tensor"),
)

BY_NAME = {stage.name: stage for stage in STAGES}
NAMES = tuple(BY_NAME)


def _dump_ast(module) -> str:
    from kina_frontend import ast

    return ast.dump(module) + "\n"


def _format_program(program) -> str:
    from kina_frontend.tensor_ir import format_program

    return format_program(program, with_locations=True)


def source_of(stage: Stage) -> str:
    """The name of the stage whose artifact `stage` reads."""
    if stage.reads:
        return stage.reads
    position = NAMES.index(stage.name)
    return NAMES[position - 1]


def needed(wanted: set[str], start: str = START) -> set[str]:
    """Every stage on the way from `start` to each stage in `wanted`."""
    result: set[str] = set()
    for target in sorted(wanted):
        name = target
        while name != start and name not in result:
            if name == START:
                raise KinaError("io", f"--emit {target}: that stage is not computed from "
                                f"'{start}', where this input starts", None)
            result.add(name)
            name = source_of(BY_NAME[name])
    return result


def run_stages(wanted: set[str], ctx: Context, start: str = START, artifact: Any = None,
               verify: bool | None = None) -> Iterator[tuple[Stage, Any]]:
    """(stage, artifact) for every stage needed to reach `wanted`, in table order, each
    computed from `artifact` (the artifact of `start`: by default the Source). Each is
    verified when `verify` is true (default: TILEGEN_VERIFY)."""
    verify = ctx.options.verify if verify is None else verify
    artifacts = {start: ctx.source if artifact is None else artifact}
    names = needed(wanted, start)
    for stage in STAGES:
        if stage.name not in names:
            continue
        result = stage.run(artifacts[source_of(stage)], ctx)
        if verify and stage.verify is not None:
            stage.verify(result, ctx)
        artifacts[stage.name] = result
        yield stage, result


def emit(name: str, ctx: Context, start: str = START, artifact: Any = None,
         verify: bool | None = None) -> str | bytes:
    """What `--emit name` prints for this input."""
    artifacts = dict((stage.name, result) for stage, result in
                     run_stages({name}, ctx, start, artifact, verify))
    return BY_NAME[name].show(artifacts[name], ctx)


def context(source: Source, names: tuple[str, ...] | None = None,
            consts: dict[str, int] | None = None, options: Config | None = None) -> Context:
    return Context(source, options or config.load(), names, tuple(sorted((consts or {}).items())))
