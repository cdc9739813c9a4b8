"""The compiler's stages, each a pure function from one IR to the next.

    tensor IR --prepare--> inlined tensor IR --lower--> loop IR --schedule--> loop IR
              --codegen--> LLVM IR (llvmlite.ir) --optimize--> LLVM module --> JIT / object
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from kina_frontend.autodiff import gradient_function
from kina_frontend.diagnostics import KinaError
from kina_frontend.tensor_ir import Function, Program
from kina_frontend.transforms import (
    check_inlined_size,
    prepare_for_codegen,
    project_before_gather,
)
from kina_frontend.verify import IRVerifyError, verify_function

from . import config, gemm_amx  # noqa: F401 (registers the bf16 gemm emitters)
from . import loopir as L
from .attention_backward_codegen import emit_fused_attention
from .cabi import build_packed_entry
from .codegen import Emitters, KernelCodegen
from .config import Config
from .divsplit import split_divided_loops_pass
from .fastcall import build_entry, build_keyword_entry
from .fission import fission_pass
from .gemm_small import emit_any_gemm
from .loopir_verify import verify_kernel
from .lower import TileChooser, lower_function
from .parallel import emit_parallel, thread_state_global
from .producer_fusion import fuse_producers_pass
from .rowscale import defer_row_scaling
from .schedule import parallelize_pass, thread_interchange_pass, vectorize_pass
from .shared import SharedStatements
from .symbols import function_symbol, kernel_symbol
from .target import LLVM_LOCK, Target, optimize, target_machine
from .vecmath import MathLibrary

# Loop-IR passes, in order; each maps (kernel, options) to a kernel.
SCHEDULE_PASSES = (
    ("fission", lambda kernel, options: fission_pass(kernel, options.target)),
    ("fuse-producers", lambda kernel, options: fuse_producers_pass(kernel, options.target)),
    ("defer-row-scaling", lambda kernel, options: defer_row_scaling(kernel)),
    ("split-divided-loops", lambda kernel, options: split_divided_loops_pass(kernel,
                                                                       options.target)),
    ("thread-interchange",
     lambda kernel, options: thread_interchange_pass(kernel, options.num_threads,
                                                     options.target)),
    ("vectorize", lambda kernel, options: vectorize_pass(kernel, options.target)),
    ("parallelize", lambda kernel, options: parallelize_pass(kernel, options.num_threads)),
)


# The statements codegen leaves to the modules above it.
EMITTERS = Emitters(gemm=emit_any_gemm, parallel=emit_parallel,
                    thread_state=thread_state_global,
                    shared=SharedStatements, attention=emit_fused_attention)


@dataclass(frozen=True)
class KernelPlan:
    """One compiled entry point: the prepared tensor function and its kernel, scheduled
    for `target`."""

    function: Function
    kernel: L.Kernel
    target: Target
    stack_bytes: int = 1 << 20  # the stack its temporaries may take (tilegen/frame.py)

    @property
    def symbol(self) -> str:
        return kernel_symbol(self.kernel.name)

    @property
    def entry_symbol(self) -> str:
        return function_symbol(self.kernel.name, "entry")

    @property
    def call_symbol(self) -> str:
        return function_symbol(self.kernel.name, "call")

    @property
    def packed_symbol(self) -> str:
        return function_symbol(self.kernel.name, "packed")

    @property
    def canonical_key(self) -> str:
        """The prepared function with its values renamed by position: two functions with the
        same key compute the same thing (an @main that only calls the forward, say) and can
        share machine code."""
        names: dict[str, str] = {}
        for position, param in enumerate(self.function.params):
            names[param.name] = f"p{position}"
        lines = [",".join(str(p.type) for p in self.function.params)]
        for op in self.function.body:
            operands = ",".join(names[v.name] for v in op.operands)
            for result in op.results:
                names[result.name] = f"v{len(names)}"
            results = ",".join(f"{names[r.name]}:{r.type}" for r in op.results)
            lines.append(f"{results}={op.op}({operands}){op.attrs}@{op.span}")
        lines.append(",".join(names[v.name] for v in self.function.results))
        return "\n".join(lines)


def prepare(program: Program, name: str, options: Config | None = None) -> Function:
    options = options or config.load()
    function = project_before_gather(prepare_for_codegen(program, name, options.max_inlined_ops))
    if options.verify:
        verify_prepared(function)
    return function


def verify_prepared(function: Function) -> None:
    """The tensor-IR verifier on a prepared function (no calls are left), as a KinaError."""
    try:
        verify_function(None, function)
    except IRVerifyError as error:
        raise KinaError("ir", f"prepared tensor IR: {error.reason}", error.span,
                        ("in context:\n" + error.context,) if error.context else ()) from None


def lower(function: Function, options: Config,
          choose_tiles: TileChooser | None = None) -> L.Kernel:
    if options.autotune and choose_tiles is None:
        raise ValueError("autotuning (TILEGEN_AUTOTUNE=1) needs the driver's tile chooser: "
                         "pass choose_tiles=tilegen.tuning.tile_chooser(options)")
    kernel = lower_function(function, options=options, choose_tiles=choose_tiles)
    if options.verify:
        verify_kernel(kernel, after="lowered")
    return kernel


def schedule(kernel: L.Kernel, options: Config) -> L.Kernel:
    """The schedule passes in order (the stages between `lowered` and `loops`)."""
    for name, pass_fn in SCHEDULE_PASSES:
        kernel = pass_fn(kernel, options)
        if options.verify:
            verify_kernel(kernel, after=name)
    return kernel


class PlanTable(Mapping[str, KernelPlan]):
    """The kernel plans of a program's functions by name, each planned on first use.

    Planning every function up front cost the sum of their inlined sizes, quadratic for a
    chain of n functions each calling the next (400: 4.6 s at compile_file); a JIT module
    now plans only what is called. What a user's program can get wrong at this stage is
    still found at construction, for every function: an inlined size over the limit and
    a `reverseMode` the autodiff transform rejects (its result is cached for later)."""

    def __init__(self, program: Program, names: tuple[str, ...] | None, options: Config,
                 choose_tiles: TileChooser | None = None):
        self._program = program
        self._options = options
        self._choose_tiles = choose_tiles
        selected = [f for f in program.functions if names is None or f.name in names]
        self._names = tuple(f.name for f in selected)
        for function in selected:  # every size diagnostic before any (possibly long) planning
            check_inlined_size(program, function, options.max_inlined_ops)
        for function in selected:
            for op in function.body:
                if op.op == "reverse_mode":
                    gradient_function(program, op.attr("callee"), op.attr("wrt"))
        self._plans: dict[str, KernelPlan] = {}
        self._lock = threading.Lock()

    @property
    def target(self) -> Target:
        return self._options.target

    def __getitem__(self, name: str) -> KernelPlan:
        plan = self._plans.get(name)
        if plan is not None:
            return plan
        if name not in self._names:
            raise KeyError(name)
        with self._lock:
            if name not in self._plans:
                prepared = prepare(self._program, name, self._options)
                kernel = schedule(lower(prepared, self._options, self._choose_tiles),
                                  self._options)
                self._plans[name] = KernelPlan(prepared, kernel, self._options.target,
                                               self._options.stack_bytes)
            return self._plans[name]

    @property
    def planned(self) -> tuple[str, ...]:
        """The functions planned so far."""
        return tuple(self._plans)

    def __contains__(self, name: object) -> bool:  # without planning it
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def plan_program(program: Program, names: tuple[str, ...] | None = None,
                 options: Config | None = None,
                 choose_tiles: TileChooser | None = None) -> list[KernelPlan]:
    """Every selected function planned now (the CLI, `.so` files and the disk cache);
    `choose_tiles`: see `lower.TileChooser`."""
    return list(PlanTable(program, names, options or config.load(), choose_tiles).values())


def plans_target(plans: list[KernelPlan]) -> Target:
    """The one target a list of plans was scheduled for (a module has one triple)."""
    targets = {plan.target for plan in plans}
    if len(targets) != 1:
        raise ValueError(f"a module is built for one target, not for "
                         f"{sorted(t.name for t in targets)}")
    return targets.pop()


def codegen(plans: list[KernelPlan], module_name: str = "kina",
            profile: str = "") -> ir.Module:
    target = plans_target(plans)
    module = ir.Module(name=module_name)
    module.triple = target.triple
    math = MathLibrary(module, target)
    for plan in plans:
        kernel_fn = KernelCodegen(module, plan.kernel, plan.symbol, math, target,
                                  EMITTERS, profile, plan.stack_bytes).build()
        packed = build_packed_entry(module, kernel_fn, plan.packed_symbol)
        entry = build_entry(module, plan.kernel, kernel_fn, packed, plan.entry_symbol)
        build_keyword_entry(module, plan.kernel, entry, plan.call_symbol)
    return module


def to_llvm(module: ir.Module, target: Target, pic: bool = False,
            optimize_module: bool = True) -> llvm.ModuleRef:
    """Parse, verify and optimise the builder's module for `target`."""
    machine = target_machine(target, pic)
    with LLVM_LOCK:
        try:
            parsed = llvm.parse_assembly(str(module))
            parsed.verify()
        except RuntimeError as error:  # a compiler bug, never the user's program
            raise KinaError("lowering", f"internal error: generated LLVM IR is invalid: "
                            f"{error}", None) from None
        parsed.triple = target.triple
        parsed.data_layout = str(machine.target_data)
        if optimize_module:
            optimize(parsed, machine)
    return parsed


def assembly(parsed: llvm.ModuleRef, target: Target) -> str:
    with LLVM_LOCK:
        return target_machine(target, False).emit_assembly(parsed)


def jit_object_code(parsed: llvm.ModuleRef, target: Target) -> bytes:
    """Object code for the in-process JIT (non-PIC, as MCJIT would generate it)."""
    with LLVM_LOCK:
        return target_machine(target, False).emit_object(parsed)


def object_code(parsed: llvm.ModuleRef, target: Target) -> bytes:
    with LLVM_LOCK:
        return target_machine(target, True).emit_object(parsed)
