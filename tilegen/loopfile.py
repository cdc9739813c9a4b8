"""Loop IR as a starting point: compile a `.loops` file (the text `--emit loops` prints).

The file's kernels are read back (`loopir_parse.parse_kernels`) and verified
(`loopir_verify`), then enter the pipeline at the `loops` stage: their schedule tags are
taken as written, and codegen, the runtime and the C ABI treat them like kernels lowered
from Kina. Each kernel becomes a function whose parameters are its input buffers and whose
results are its outputs, in the order the file gives them.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np

from kina_frontend.diagnostics import KinaError, Source
from kina_frontend.tensor_ir import Function, Value
from kina_frontend.types import DType, TensorType

from . import config
from . import loopir as L
from .loopir_parse import parse_kernels
from .pipeline import KernelPlan
from .run_inputs import format_seconds, placeholder_value

SUFFIX = ".loops"


@dataclass(frozen=True)
class LoopPlan(KernelPlan):
    """The plan of a kernel read from loop IR: its function is only its signature."""

    @property
    def canonical_key(self) -> str:
        return L.format_kernel(self.kernel)


def _tensor_type(buffer: L.Buffer) -> TensorType:
    return TensorType(DType(str(buffer.dtype)), tuple(buffer.shape))


def kernel_plan(kernel: L.Kernel, options: config.Config) -> LoopPlan:
    buffers = {b.name: b for b in kernel.buffers}
    params = tuple(Value(name, _tensor_type(buffers[name])) for name in kernel.inputs)
    results = tuple(Value(name, _tensor_type(buffers[name])) for name in kernel.outputs)
    return LoopPlan(Function(kernel.name, params, (), results), kernel, options.target,
                    options.stack_bytes)


def plans_from_text(source: Source, names: tuple[str, ...] | None = None,
                    options: config.Config | None = None) -> tuple[LoopPlan, ...]:
    """The verified kernels of a `.loops` file as plans (only `names`, when given)."""
    options = options or config.load()
    kernels = parse_kernels(source.text, source.name, verify=True)
    seen = [k.name for k in kernels]
    duplicates = sorted({n for n in seen if seen.count(n) > 1})
    if duplicates:
        raise KinaError("ir", f"{source.name}: kernel @{duplicates[0]} is defined twice", None)
    if names is not None:
        missing = [n for n in names if n not in seen]
        if missing:
            raise KinaError("name", f"no kernel '{missing[0]}' in {source.name} (it has: "
                            f"{', '.join(seen)})", None)
        kernels = tuple(k for k in kernels if k.name in names)
    return tuple(kernel_plan(kernel, options) for kernel in kernels)


def compile_loops(source: Source, jit: bool = True, output: str | None = None,
                  functions=None, target: str | None = None):
    """A module of the file's kernels (see `tilegen.compile_file`, which calls this for a
    path ending in `.loops`): JIT in memory, or a shared library kept at `output`."""
    from .cache import MEMORY, cache_key
    from .library import aot_module
    from .runtime import jit_module

    settings = config.load(target)
    names = None if functions is None else tuple(functions)
    key = cache_key(source.name, f"{source.text}\0{names}\0loops", settings, jit)
    if output is None and settings.memory_cache_entries:
        cached = MEMORY.get(key)
        if cached is not None:
            return cached
    plans = list(plans_from_text(source, names, settings))
    if jit and output is None:
        module = jit_module(plans, settings.profile)
    else:
        module = aot_module(plans, settings.profile, keep_path=output)
    if output is None:
        MEMORY.put(key, module, settings.memory_cache_entries)
    return module


def input_values(kernel: L.Kernel, seed: int) -> list[np.ndarray]:
    """Deterministic inputs, as `--run` draws an @main's placeholders: floats standard
    normal from default_rng(seed + k) for input k; ids uniform in [0, n) for the smallest
    limit of a check site reading that input (8 when none does); BOOL true with
    probability 1/2."""
    limits: dict[str, int] = {}
    for site in kernel.check_sites:
        if site.ids_argument:
            limits[site.ids_argument] = min(site.limit, limits.get(site.ids_argument,
                                                                   site.limit))
    values = []
    for number, name in enumerate(kernel.inputs):
        if seed + number < 0:
            raise KinaError("run", f"--seed {seed} gives input {number} the NumPy seed "
                            f"{seed + number}, and seeds must be non-negative", None)
        values.append(placeholder_value(_tensor_type(kernel.buffer(name)), seed + number,
                                        limits.get(name, 8)))
    return values


def run_kernel(plans: list[LoopPlan], name: str | None, seed: int) -> int:
    """`--run` for a `.loops` file: the kernel named `name`, else the one named `main`, else
    the only one; its results' types, sums and CRC-32s, as for an @main."""
    from .runtime import IdOutOfRangeError, jit_module

    by_name = {plan.kernel.name: plan for plan in plans}
    if name is None:
        name = "main" if "main" in by_name else plans[0].kernel.name if len(plans) == 1 \
            else None
    if name is None:
        raise KinaError("run", f"--run: which kernel? give --function NAME (the file has: "
                        f"{', '.join(by_name)})", None)
    kernel = by_name[name].kernel
    inputs = input_values(kernel, seed)
    started = time.perf_counter()
    function = getattr(jit_module([by_name[name]], config.load().profile), name)
    compiled = time.perf_counter()
    try:
        outputs = function(*inputs)
    except IdOutOfRangeError as error:  # ids computed in the kernel can leave their range
        raise KinaError("run", f"@{name}: {error}", None) from None
    finished = time.perf_counter()
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    print(f"ran @{name} with {len(inputs)} input(s) (seed {seed}): compiled in "
          f"{format_seconds(compiled - started)}, ran in {format_seconds(finished - compiled)}")
    for output, array in zip(kernel.outputs, outputs, strict=True):
        crc = zlib.crc32(np.ascontiguousarray(array).tobytes())
        total = float(np.sum(array, dtype=np.float64))
        print(f"  {output}: {_tensor_type(kernel.buffer(output))}  sum={total:.9g}  "
              f"crc32={crc:08x}")
    return 0
