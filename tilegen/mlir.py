"""Tensor IR -> MLIR text: `func`, `linalg`, `tensor`, `arith` and `math` on `tensor<...>`.

    from tilegen.mlir import emit_mlir
    text = emit_mlir(program)          # concrete (specialised) tensor IR
    # mlir-opt-19 --verify-each out.mlir

One generic driver walks every function of the program and dispatches each operation to
its op's `mlir` rule in kina_frontend/ops (`OpDef.mlir`); an op without one is a KinaError
naming the op and pointing at its source. The structural ops are handled here:

- `call` becomes `func.call` (every Kina function is emitted, callees included);
- `reverse_mode` becomes a `func.call` of the function the autodiff transform
  (`kina_frontend.autodiff.gradient_function`) produces, emitted once per (callee, wrt);
- an @main's `placeholder`s become its arguments, in order, and its sink values (read by
  no later operation) its results -- the same convention `--run` and codegen use.

Rules build text through `FunctionEmitter`: it names SSA values after the Kina values,
declares each affine map once per module (`#mapN`), and builds `linalg.generic` regions.
The text is plain value semantics on tensors (destination operands come from
`tensor.empty`), so `mlir-opt --one-shot-bufferize` can take it to memrefs and loops.

What the text does not carry: compiled tilegen checks gather/one_hot ids and raises; in
MLIR an out-of-range id is undefined behaviour (`tensor.extract` out of bounds), as it is
in every MLIR pipeline that does not add its own assertions.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kina_frontend.diagnostics import KinaError
from kina_frontend.names import NameSupply
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Function, Operation, Program
from kina_frontend.transforms import inline_calls, placeholders_to_params
from kina_frontend.types import DType, TensorType

# The mlir-opt the goldens are written for (Debian package mlir-19-tools).
MLIR_OPT = "mlir-opt-19"
MLIR_TRANSLATE = "mlir-translate-19"

# mlir-opt-19 passes that take the emitted text to the LLVM dialect (then
# `mlir-translate-19 --mlir-to-llvmir`): bufferize with identity layouts at function
# boundaries (so returned views copy with a plain memcpy), CSE and canonicalize, results to
# out-params, linalg to loops, then the standard conversions; math ops without an LLVM
# intrinsic (tanh) call libm.
# `llvm-request-c-wrappers` adds `_mlir_ciface_NAME` entry points taking one memref
# descriptor pointer per argument and per result.
LOWERING_PIPELINE = (
    "--llvm-request-c-wrappers",
    "--one-shot-bufferize=bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map",
    # Drops the self-copies in-place insert_slices leave behind (concat writes each operand
    # straight into its slice of the result): CSE merges the two equal subviews, then
    # canonicalization erases the copy of a subview onto itself.
    "--cse",
    "--canonicalize",
    "--buffer-results-to-out-params",
    "--convert-linalg-to-loops",
    "--expand-strided-metadata",
    "--lower-affine",
    "--convert-scf-to-cf",
    "--convert-math-to-llvm",
    "--convert-math-to-libm",
    "--convert-arith-to-llvm",
    "--convert-index-to-llvm",
    "--finalize-memref-to-llvm",
    "--convert-func-to-llvm",
    "--convert-cf-to-llvm",
    "--reconcile-unrealized-casts",
)

_ELEMENT_TYPES = {DType.F32: "f32", DType.F64: "f64", DType.I64: "i64", DType.BF16: "bf16",
                  DType.BOOL: "i1"}
# Bit patterns for the non-finite float constants (MLIR float literals are decimal or hex).
_NONFINITE_HEX = {
    DType.F32: {"inf": "0x7F800000", "-inf": "0xFF800000", "nan": "0x7FC00000"},
    DType.F64: {"inf": "0x7FF0000000000000", "-inf": "0xFFF0000000000000",
                "nan": "0x7FF8000000000000"},
    DType.BF16: {"inf": "0x7F80", "-inf": "0xFF80", "nan": "0x7FC0"},
}


# ---- types and literals ---------------------------------------------------------------------

def element_type(dtype: DType) -> str:
    return _ELEMENT_TYPES[dtype]


def tensor_type(ttype: TensorType) -> str:
    """`f32[1, 36, 8]` -> `tensor<1x36x8xf32>`; rank 0 is `tensor<f32>`."""
    dims = "".join(f"{d}x" for d in ttype.concrete_shape)
    return f"tensor<{dims}{element_type(ttype.dtype)}>"


def scalar_literal(value: float, dtype: DType) -> str:
    """An `arith.constant` literal of `dtype`: decimal with a point, or hex for inf/nan."""
    if not dtype.is_float:
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return _NONFINITE_HEX[dtype]["nan"]
    if math.isinf(value):
        return _NONFINITE_HEX[dtype]["inf" if value > 0 else "-inf"]
    text = repr(value)  # shortest text that reads back as the same double
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    elif "." not in text and "e" not in text:
        text += ".0"
    return text


def affine_map(rank: int, results: Sequence[int]) -> str:
    """`affine_map<(d0, d1, d2) -> (d0, d2)>`: loop dims `results` of a `rank`-deep nest."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    picked = ", ".join(f"d{i}" for i in results)
    return f"affine_map<({dims}) -> ({picked})>"


_SSA_UNSAFE = re.compile(r"[^A-Za-z0-9_.$-]")


def _ssa_hint(hint: str) -> str:
    hint = _SSA_UNSAFE.sub("_", hint) or "v"
    return hint if not hint[0].isdigit() else "v" + hint


def _symbol(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.$]", "_", name) or "f"
    return name if not name[0].isdigit() else "f" + name


# ---- values and regions ---------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """An SSA tensor value: its name (with the `%`) and its Kina type."""

    name: str
    type: TensorType

    def __str__(self) -> str:
        return self.name


# A generic input: an operand read at the identity map, or with its dims picked from the
# loop dims (`(row_max, (0, 1, 2))` reads a rank-3 value inside a rank-4 nest).
GenericInput = Operand | tuple[Operand, tuple[int, ...]]


class RegionBuilder:
    """The body of one linalg.generic: straight-line scalar ops ending in linalg.yield."""

    def __init__(self, function: FunctionEmitter):
        self._function = function
        self.lines: list[str] = []

    def let(self, rhs: str, hint: str = "v") -> str:
        """Emit `%name = rhs` and return `%name`."""
        name = self._function.fresh(hint)
        self.lines.append(f"{name} = {rhs}")
        return name

    def index(self, dim: int) -> str:
        """The current loop index along loop dim `dim`, as an `index`."""
        return self.let(f"linalg.index {dim} : index", f"i{dim}")

    def index_i64(self, dim: int) -> str:
        return self.let(f"arith.index_cast {self.index(dim)} : index to i64", f"i{dim}_i64")


Body = Callable[..., str | Sequence[str]]


class FunctionEmitter:
    """What an op's `mlir` rule may use while one function's body is emitted."""

    def __init__(self, module: ModuleEmitter, function: Function):
        self.module = module
        self.function = function
        self.lines: list[str] = []
        self.current: Operation | None = None
        self._names = NameSupply(separator="_")
        self._constants: dict[tuple[str, str], str] = {}

    # ---- names and lines ----------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        return "%" + self._names.fresh(_ssa_hint(hint))

    def out(self, index: int = 0) -> str:
        """The name hint for the current operation's result `index` (its Kina name)."""
        assert self.current is not None
        return self.current.results[index].name

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def let(self, hint: str, rhs: str) -> str:
        """Emit `%name = rhs` at function level and return `%name`."""
        name = self.fresh(hint)
        self.emit(f"{name} = {rhs}")
        return name

    def fail(self, message: str) -> KinaError:
        span = self.current.span if self.current is not None else None
        return KinaError("unsupported", f"MLIR emission: {message}", span)

    # ---- types --------------------------------------------------------------------------------

    tensor_type = staticmethod(tensor_type)
    element_type = staticmethod(element_type)

    @staticmethod
    def value(name: str, ttype: TensorType) -> Operand:
        """An Operand for an SSA name a rule produced (to pass to another helper)."""
        return Operand(name, ttype)

    # ---- constants and destinations -----------------------------------------------------------

    def constant(self, value: float, dtype: DType) -> str:
        """A scalar `arith.constant`, emitted once per function. Call it at function level
        (before building a region); regions may read it."""
        literal = scalar_literal(value, dtype)
        key = (literal, element_type(dtype))
        if key not in self._constants:
            hint = "cst" if dtype.is_float else "c"
            self._constants[key] = self.let(hint, f"arith.constant {literal} : {key[1]}")
        return self._constants[key]

    def empty(self, ttype: TensorType, hint: str) -> str:
        return self.let(hint, f"tensor.empty() : {tensor_type(ttype)}")

    def filled(self, ttype: TensorType, value: float, hint: str) -> str:
        """`linalg.fill` of a fresh `tensor.empty` with one scalar."""
        scalar = self.constant(value, ttype.dtype)
        init = self.empty(ttype, hint + "_init")
        ty = tensor_type(ttype)
        return self.let(hint, f"linalg.fill ins({scalar} : {element_type(ttype.dtype)}) "
                              f"outs({init} : {ty}) -> {ty}")

    # ---- reshapes ----------------------------------------------------------------------------

    def collapse_shape(self, x: Operand, groups: Sequence[Sequence[int]],
                       hint: str) -> Operand:
        """`tensor.collapse_shape`: result dim g is the product of x's dims in groups[g]."""
        shape = x.type.concrete_shape
        result = x.type.with_shape(tuple(math.prod(shape[d] for d in g) for g in groups))
        name = self.let(hint, f"tensor.collapse_shape {x} {_groups(groups)} : "
                              f"{tensor_type(x.type)} into {tensor_type(result)}")
        return Operand(name, result)

    def expand_shape(self, x: Operand, groups: Sequence[Sequence[int]], result: TensorType,
                     hint: str) -> Operand:
        """`tensor.expand_shape` (MLIR 19 form, with `output_shape`)."""
        dims = ", ".join(str(d) for d in result.concrete_shape)
        name = self.let(hint, f"tensor.expand_shape {x} {_groups(groups)} output_shape [{dims}]"
                              f" : {tensor_type(x.type)} into {tensor_type(result)}")
        return Operand(name, result)

    # ---- linalg.generic -----------------------------------------------------------------------

    def generic(self, hint: str | Sequence[str], inputs: Sequence[GenericInput],
                outputs: Sequence[tuple[str, TensorType, tuple[int, ...]]],
                iterators: Sequence[str], body: Body) -> list[str]:
        """Emit a linalg.generic over a len(iterators)-deep loop nest.

        `outputs` are (init value, type, loop dims it is indexed by). `body(b, *ins, *outs)`
        receives a RegionBuilder and the block arguments' names and returns the value(s) to
        yield, one per output. `hint` names the result, or each result. Returns the names.
        """
        rank = len(iterators)
        reads = [(i, tuple(range(rank))) if isinstance(i, Operand) else i for i in inputs]
        maps = [self.module.map_alias(affine_map(rank, dims)) for _, dims in reads]
        maps += [self.module.map_alias(affine_map(rank, dims)) for _, _, dims in outputs]
        region = RegionBuilder(self)
        in_args = [self.fresh("in") for _ in reads]
        out_args = [self.fresh("out") for _ in outputs]
        yielded = body(region, *in_args, *out_args)
        yielded = [yielded] if isinstance(yielded, str) else list(yielded)
        if len(yielded) != len(outputs):
            raise self.fail(f"a generic body yielded {len(yielded)} value(s) for "
                            f"{len(outputs)} output(s)")
        out_elements = [element_type(t.dtype) for _, t, _ in outputs]
        block_args = [f"{a}: {element_type(o.type.dtype)}"
                      for a, (o, _) in zip(in_args, reads, strict=True)]
        block_args += [f"{a}: {e}" for a, e in zip(out_args, out_elements, strict=True)]
        result_types = [tensor_type(t) for _, t, _ in outputs]
        hints = [hint] if isinstance(hint, str) else list(hint)
        if len(hints) != len(outputs):
            hints = [f"{hints[0]}_{k}" for k in range(len(outputs))]
        names = [self.fresh(h) for h in hints]
        iterator_text = ", ".join(f'"{it}"' for it in iterators)
        lines = [f"{', '.join(names)} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
                 f"iterator_types = [{iterator_text}]}}"]
        if reads:
            lines.append(f"    ins({', '.join(o.name for o, _ in reads)} : "
                         f"{', '.join(tensor_type(o.type) for o, _ in reads)})")
        lines.append(f"    outs({', '.join(init for init, _, _ in outputs)} : "
                     f"{', '.join(result_types)}) {{")
        lines.append(f"^bb0({', '.join(block_args)}):")
        lines.extend("  " + line for line in region.lines)
        lines.append(f"  linalg.yield {', '.join(yielded)} : {', '.join(out_elements)}")
        arrow = result_types[0] if len(result_types) == 1 else f"({', '.join(result_types)})"
        lines.append(f"}} -> {arrow}")
        self.lines.extend(lines)
        return names

    def parallel(self, result: TensorType, inputs: Sequence[GenericInput], body: Body,
                 hint: str | None = None) -> str:
        """An all-parallel generic writing a fresh `result`; `body(b, *ins)` gives the
        element (the output's block argument is not passed: nothing reads it)."""
        hint = hint or self.out()
        init = self.empty(result, hint + "_init")
        identity = tuple(range(result.rank))
        (name,) = self.generic(hint, inputs, [(init, result, identity)],
                               ["parallel"] * result.rank,
                               lambda b, *args: body(b, *args[:len(inputs)]))
        return name

    def reduce(self, x: Operand, axis: int, accumulators: Sequence[tuple[DType, float | int]],
               body: Body, hint: str | Sequence[str]) -> list[str]:
        """Reduce `x` along `axis` into one tensor per accumulator (dtype, initial value):
        a generic whose `axis` iterator is a reduction. `body(b, element, *accs)` returns
        the updated accumulators. `hint` names the result, or each result."""
        hints = [hint] if isinstance(hint, str) else list(hint)
        shape = x.type.concrete_shape
        kept = tuple(d for d in range(len(shape)) if d != axis)
        outputs = []
        for (dtype, initial), name in zip(accumulators, hints, strict=True):
            ttype = TensorType(dtype, tuple(shape[d] for d in kept))
            outputs.append((self.filled(ttype, initial, f"{name}_acc"), ttype, kept))
        iterators = ["reduction" if d == axis else "parallel" for d in range(len(shape))]
        return self.generic(hints, [x], outputs, iterators, body)


def _groups(groups: Sequence[Sequence[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(str(d) for d in g) + "]" for g in groups) + "]"


# ---- the driver ---------------------------------------------------------------------------

class ModuleEmitter:
    """Collects the module's functions and affine-map aliases."""

    def __init__(self, program: Program):
        self.program = program
        self.functions: list[str] = []
        self._maps: dict[str, str] = {}
        self._symbols: set[str] = {_symbol(name) for name in program.function_names}
        self._gradients: dict[tuple[str, tuple], str] = {}

    def map_alias(self, text: str) -> str:
        if text not in self._maps:
            self._maps[text] = f"#map{len(self._maps)}"
        return self._maps[text]

    def text(self) -> str:
        header = ["// MLIR emitted by tilegen from Kina tensor IR "
                  "(func, linalg, tensor, arith, math on tensors).",
                  f"// Check: {MLIR_OPT} --verify-each FILE.mlir"]
        aliases = [f"{alias} = {text}" for text, alias in self._maps.items()]
        parts = ["\n".join(header + aliases)] + self.functions
        return "\n\n".join(parts) + "\n"

    def emit_function(self, function: Function, symbol: str | None = None) -> None:
        text = _emit_function(self, function, symbol or _symbol(function.name))
        self.functions.append(text)

    def gradient_symbol(self, op: Operation) -> str:
        """The emitted function for `reverse_mode(callee, wrt)`, emitted on first use."""
        callee, wrt_attr = str(op.attr("callee")), op.attr("wrt")
        wrt = tuple(wrt_attr) if isinstance(wrt_attr, tuple) else ()
        key = (callee, wrt)
        if key in self._gradients:
            return self._gradients[key]
        try:
            from kina_frontend.autodiff import gradient_function
        except ModuleNotFoundError as error:
            if error.name != "kina_frontend.autodiff":
                raise
            raise KinaError("unsupported", f"MLIR emission: reverseMode({callee}, ...) needs "
                            "the autodiff transform (kina_frontend.autodiff), which this build "
                            "does not have", op.span) from None
        transformed = gradient_function(self.program, callee, list(wrt))
        gradient = transformed.program.function(transformed.name)
        # The transform's output may call helpers of its own program; inline them so the
        # emitted function stands alone next to this program's functions.
        gradient = inline_calls(transformed.program, gradient)
        symbol = base = _symbol(transformed.name)
        counter = 0
        while symbol in self._symbols:
            counter += 1
            symbol = f"{base}_{counter}"
        self._symbols.add(symbol)
        self._gradients[key] = symbol
        self.emit_function(dataclasses.replace(gradient, is_main=False), symbol)
        return symbol


def emit_mlir(program: Program) -> str:
    """MLIR text for every function of a concrete tensor-IR program."""
    module = ModuleEmitter(program)
    for function in program.functions:
        module.emit_function(function)
    return module.text()


def _emit_function(module: ModuleEmitter, function: Function, symbol: str) -> str:
    if function.is_main:
        function = placeholders_to_params(function)
    emitter = FunctionEmitter(module, function)
    values: dict[str, Operand] = {}
    params = []
    for param in function.params:
        operand = Operand(emitter.fresh(param.name), param.type)
        values[param.name] = operand
        params.append(f"{operand.name}: {tensor_type(param.type)}")
    for op in function.body:
        emitter.current = op
        operands = [values[v.name] for v in op.operands]
        names = _emit_operation(module, emitter, op, operands)
        names = (names,) if isinstance(names, str) else tuple(names)
        if len(names) != len(op.results):
            raise emitter.fail(f"the rule for '{op.op}' gave {len(names)} value(s) for "
                               f"{len(op.results)} result(s)")
        for value, name in zip(op.results, names, strict=True):
            values[value.name] = Operand(name, value.type)
    emitter.current = None
    results = [values[v.name] for v in function.results]
    result_types = ", ".join(tensor_type(r.type) for r in results)
    head = f"func.func @{symbol}({', '.join(params)})"
    if results:
        head += f" -> ({result_types})"
    lines = [head + " {"]
    lines.extend("  " + line for line in emitter.lines)
    if results:
        lines.append(f"  return {', '.join(r.name for r in results)} : {result_types}")
    else:
        lines.append("  return")
    lines.append("}")
    return "\n".join(lines)


def _emit_operation(module: ModuleEmitter, emitter: FunctionEmitter, op: Operation,
                    operands: list[Operand]) -> str | Sequence[str]:
    if op.op == "call":
        return _emit_call(emitter, _symbol(str(op.attr("callee"))), op, operands)
    if op.op == "reverse_mode":
        return _emit_call(emitter, module.gradient_symbol(op), op, operands)
    if op.op == "placeholder":
        raise emitter.fail("placeholder outside an @main function")
    definition = REGISTRY.get(op.op)
    if definition is None:
        raise emitter.fail(f"unknown op '{op.op}'")
    if definition.mlir is None:
        raise emitter.fail(f"op '{op.op}' has no MLIR emission rule (the `mlir=` field of its "
                           f"OpDef in kina_frontend/ops/{definition.family}*.py)")
    return definition.mlir(emitter, op, operands)


def _emit_call(emitter: FunctionEmitter, symbol: str, op: Operation,
               operands: list[Operand]) -> list[str]:
    names = [emitter.fresh(r.name) for r in op.results]
    arg_types = ", ".join(tensor_type(o.type) for o in operands)
    result_types = ", ".join(tensor_type(r.type) for r in op.results)
    lhs = f"{', '.join(names)} = " if names else ""
    emitter.emit(f"{lhs}func.call @{symbol}({', '.join(o.name for o in operands)}) : "
                 f"({arg_types}) -> ({result_types})")
    return names


# ---- checking with the real mlir-opt ------------------------------------------------------

def run_mlir_tool(tool: str, text: str, *flags: str,
                  timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Pipe `text` through an MLIR tool (`mlir-opt-19`, `mlir-translate-19`) with `flags`."""
    binary = shutil.which(tool)
    if binary is None:
        raise FileNotFoundError(f"{tool} is not installed (Debian: apt-get install "
                                "mlir-19-tools)")
    return subprocess.run([binary, *flags, "-"], input=text, capture_output=True, text=True,
                          timeout=timeout)


def run_mlir_opt(text: str, *flags: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Pipe `text` through mlir-opt-19 with `flags` (none: parse and verify)."""
    return run_mlir_tool(MLIR_OPT, text, *flags, timeout=timeout)


def lower_to_llvm_ir(text: str) -> str:
    """The emitted MLIR as LLVM IR text, through LOWERING_PIPELINE and mlir-translate-19.
    Raises RuntimeError with the tool's message when a step fails."""
    lowered = run_mlir_opt(text, *LOWERING_PIPELINE)
    if lowered.returncode != 0:
        raise RuntimeError(f"{MLIR_OPT} lowering failed:\n{lowered.stderr}")
    translated = run_mlir_tool(MLIR_TRANSLATE, lowered.stdout, "--mlir-to-llvmir")
    if translated.returncode != 0:
        raise RuntimeError(f"{MLIR_TRANSLATE} failed:\n{translated.stderr}")
    return translated.stdout
