"""MLIR emission (tilegen/mlir.py and the `mlir=` rules in kina_frontend/ops).

- goldens: tests/golden/<example>.mlir is the emitted text of each StoryLM-0 example;
- the real mlir-opt-19 parses and verifies every golden and a small program per op, and
  lowers them to the LLVM dialect;
- the lowered code runs (mlir-translate-19, then llvmlite's MCJIT) and matches the NumPy
  reference interpreter for every op program, and the StoryLM-0 NumPy reference for the
  forward and rollout goldens -- so the text is checked for meaning, not only for syntax;
- every op in the registry has an MLIR rule, and a missing rule is an error naming the op.

Regenerate the goldens after an intended change to the emitted text:

    TILEGEN_UPDATE_GOLDENS=1 python -m pytest tests/test_mlir.py

Tests that need mlir-opt-19 / mlir-translate-19 (Debian package mlir-19-tools) skip with a
reason when the tools are absent -- except when the environment has CI=true, where a missing
tool is a failure (.ci/run installs it).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kina_frontend import KinaError, check_source, interpret, load_source, specialize
from kina_frontend.diagnostics import Source
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Program, parse_ir
from kina_frontend.transforms import placeholders_to_params
from kina_frontend.types import DType
from tilegen.mlir import (
    LOWERING_PIPELINE,
    MLIR_OPT,
    MLIR_TRANSLATE,
    emit_mlir,
    lower_to_llvm_ir,
    run_mlir_opt,
)

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
EXAMPLES = ("storylm0_forward", "storylm0_rollout", "storylm0_nll_step")
UPDATE = os.environ.get("TILEGEN_UPDATE_GOLDENS", "") not in ("", "0")
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")


def require_tool(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if IN_CI:
            pytest.fail(f"CI=true but {tool} is not installed (apt-get install mlir-19-tools; "
                        ".ci/run does this)")
        pytest.skip(f"{tool} is not installed (apt-get install mlir-19-tools); with CI=true "
                    "this is a failure")
    return path


def compile_example(name: str) -> Program:
    return specialize(check_source(load_source(REPO / "examples" / f"{name}.kina")))


def program(text: str) -> Program:
    return specialize(check_source(Source("<test>", text)))


def emit_example(name: str) -> str:
    """The example's MLIR (reverseMode expanded by the autodiff transform)."""
    return emit_mlir(compile_example(name))


# ---- the per-op programs ----------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A small Kina program; `f` is the function under test (with @main, `main`)."""

    name: str
    source: str
    id_limit: int = 4  # I64 inputs are drawn from [0, id_limit)
    positive: bool = False  # float inputs in [0.5, 2) (log, sqrt, div)
    ties: bool = False  # float inputs are small integers (argmax ties)
    entry: str = "f"
    ir: bool = False  # `source` is tensor IR text (for the internal ops autodiff emits)


def f32(*dims) -> str:
    return f"Tensor[F32, [{', '.join(str(d) for d in dims)}], @host]"


def i64(*dims) -> str:
    return f"Tensor[I64, [{', '.join(str(d) for d in dims)}], @host]"


def f64(*dims) -> str:
    return f"Tensor[F64, [{', '.join(str(d) for d in dims)}], @host]"


def fn(params: str, result: str, body: str) -> str:
    return f"fn f({params}) -> {result} {{ {body} }}"


CASES = [
    Case("add", fn(f"x: {f32(3, 5)}, y: {f32(3, 5)}", f32(3, 5), "return add(x, y);")),
    Case("sub_literal", fn(f"x: {f32(7)}", f32(7), "return sub(1.0, x);")),
    Case("mul_rank0", fn(f"x: {f32()}, y: {f32()}", f32(), "return mul(x, y);")),
    Case("div", fn(f"x: {f32(2, 3, 4)}, y: {f32(2, 3, 4)}", f32(2, 3, 4), "return div(x, y);"),
         positive=True),
    Case("div_literal", fn(f"x: {f32(5)}", f32(5), "return div(x, 1e-3);")),
    Case("add_i64_literal", fn(f"a: {i64(2, 3)}", i64(2, 3), "return add(a, 2);")),
    Case("sub_mul_i64", fn(f"a: {i64(2, 3)}, b: {i64(2, 3)}", i64(2, 3),
                           "return mul(sub(a, b), a);")),
    Case("neg", fn(f"x: {f32(4, 3)}", f32(4, 3), "return neg(x);")),
    Case("neg_i64", fn(f"a: {i64(5)}", i64(5), "return neg(a);")),
    Case("exp", fn(f"x: {f32(3, 1, 5)}", f32(3, 1, 5), "return exp(x);")),
    Case("exp_f64", fn(f"x: {f64(6)}", f64(6), "return exp(x);")),
    Case("log", fn(f"x: {f32(3, 5)}", f32(3, 5), "return log(x);"), positive=True),
    Case("sqrt", fn(f"x: {f32(17)}", f32(17), "return sqrt(x);"), positive=True),
    Case("tanh", fn(f"x: {f32(2, 2, 2, 2)}", f32(2, 2, 2, 2), "return tanh(x);")),
    Case("sum_axis0", fn(f"x: {f32(4, 3)}", f32(3), "return sum(x, axis=0);")),
    Case("sum_to_rank0", fn(f"x: {f32(9)}", f32(), "return sum(x, axis=0);")),
    Case("sum_i64", fn(f"a: {i64(2, 5)}", i64(2), "return sum(a, axis=-1);"), id_limit=100),
    Case("max", fn(f"x: {f32(3, 5, 2)}", f32(3, 2), "return max(x, axis=1);")),
    Case("max_i64", fn(f"a: {i64(3, 4)}", i64(4), "return max(a, axis=0);"), id_limit=50),
    Case("argmax", fn(f"x: {f32(5, 3)}", i64(3), "return argmax(x, axis=0);"), ties=True),
    Case("argmax_last", fn(f"x: {f32(2, 3, 8)}", i64(2, 3), "return argmax(x, axis=2);")),
    Case("argmax_i64", fn(f"a: {i64(4, 6)}", i64(4), "return argmax(a, axis=1);"), id_limit=3),
    Case("softmax", fn(f"x: {f32(2, 5, 3)}", f32(2, 5, 3), "return softmax(x, axis=1);")),
    Case("softmax_rank1", fn(f"x: {f32(7)}", f32(7), "return softmax(x, axis=0);")),
    Case("log_softmax", fn(f"x: {f32(2, 3, 4)}", f32(2, 3, 4),
                           "return log_softmax(x, axis=2);")),
    Case("matmul_rank2", fn(f"a: {f32(3, 4)}, b: {f32(4, 5)}", f32(3, 5), "return matmul(a, b);")),
    Case("matmul_rank3", fn(f"a: {f32(2, 3, 4)}, b: {f32(2, 4, 5)}", f32(2, 3, 5),
                            "return matmul(a, b);")),
    Case("matmul_rank4", fn(f"a: {f32(2, 3, 4, 5)}, b: {f32(2, 3, 5, 2)}", f32(2, 3, 4, 2),
                            "return matmul(a, b);")),
    Case("reshape_expand", fn(f"x: {f32(6)}", f32(2, 3), "return reshape(x, [2, 3]);")),
    Case("reshape_collapse", fn(f"x: {f32(2, 3, 4)}", f32(6, 4), "return reshape(x, [6, 4]);")),
    Case("reshape_regroup", fn(f"x: {f32(2, 3)}", f32(3, 2), "return reshape(x, [3, 2]);")),
    Case("reshape_infer", fn(f"x: {f32(4, 6)}", f32(3, 8), "return reshape(x, [3, -1]);")),
    Case("reshape_unit_dims", fn(f"x: {f32(2, 1, 3)}", f32(2, 3), "return reshape(x, [2, 3]);")),
    Case("reshape_from_rank0", fn(f"x: {f32()}", f32(1, 1), "return reshape(x, [1, 1]);")),
    Case("reshape_to_rank0", fn(f"x: {f32(1, 1)}", f32(), "return reshape(x, []);")),
    Case("transpose", fn(f"x: {f32(2, 3, 4)}", f32(4, 2, 3), "return transpose(x, [2, 0, 1]);")),
    Case("transpose_identity", fn(f"x: {f32(2, 3)}", f32(2, 3), "return transpose(x, [0, 1]);")),
    Case("broadcast_leading", fn(f"x: {f32(3)}", f32(2, 3), "return broadcast(x, [2, 3]);")),
    Case("broadcast_stretch", fn(f"x: {f32(3, 1)}", f32(3, 4), "return broadcast(x, [3, 4]);")),
    Case("broadcast_scale", fn(f"x: {f32(1, 1, 1, 1)}", f32(1, 2, 3, 3),
                               "return broadcast(x, [1, 2, 3, 3]);")),
    Case("broadcast_mixed", fn(f"x: {f32(2, 1, 3)}", f32(4, 2, 5, 3),
                               "return broadcast(x, [4, 2, 5, 3]);")),
    Case("broadcast_all_stretched", fn(f"x: {f32(1, 1)}", f32(4, 4),
                                       "return broadcast(x, [4, 4]);")),
    Case("broadcast_rank0", fn(f"x: {f32()}", f32(2, 2), "return broadcast(x, [2, 2]);")),
    Case("broadcast_same", fn(f"x: {f32(2, 3)}", f32(2, 3), "return broadcast(x, [2, 3]);")),
    Case("broadcast_i64", fn(f"a: {i64(3)}", i64(2, 3), "return broadcast(a, [2, 3]);")),
    Case("gather", fn(f"t: {f32(5, 3)}, ids: {i64(2, 4)}", f32(2, 4, 3), "return gather(t, ids);"),
         id_limit=5),
    Case("gather_rank0_ids", fn(f"t: {f32(5, 3)}, ids: {i64()}", f32(3), "return gather(t, ids);"),
         id_limit=5),
    Case("one_hot", fn(f"ids: {i64(2, 3)}", f32(2, 3, 4), "return one_hot(ids, 4);")),
    Case("one_hot_rank0", fn(f"ids: {i64()}", f32(3), "return one_hot(ids, 3);"), id_limit=3),
    Case("call_tuple", f"""
fn pair(x: {f32(3)}) -> ({f32(3)}, {f32(3)}) {{ return (neg(x), exp(x)); }}
fn f(x: {f32(3)}) -> ({f32(3)}, {f32(3)}) {{
  let (a, b) = pair(x);
  return (add(a, b), x);
}}"""),
    Case("main_placeholders", f"""
fn g(x: {f32(2, 3)}, ids: {i64(2)}) -> {f32(2, 3)} {{ return mul(x, one_hot(ids, 3)); }}
@main
fn main() {{
  let x = placeholder({f32(2, 3)});
  let ids = placeholder({i64(2)});
  let y = g(x, ids);
  let z = sum(y, axis=1);
}}""", id_limit=3, entry="main"),
]
def bool_(*dims) -> str:
    return f"Tensor[BOOL, [{', '.join(str(d) for d in dims)}], @host]"


def bf16(*dims) -> str:
    return f"Tensor[BF16, [{', '.join(str(d) for d in dims)}], @host]"


# The transformer op set: activations, comparisons, where, iota, cast, mean, min.
CASES += [Case(name, fn(f"x: {f32(3, 5)}", f32(3, 5), f"return {name}(x);"))
          for name in ("relu", "gelu", "gelu_tanh", "erf", "sigmoid", "silu", "abs")]
CASES += [
    Case("rsqrt", fn(f"x: {f32(7)}", f32(7), "return rsqrt(x);"), positive=True),
    Case("abs_i64", fn(f"a: {i64(4)}", i64(4), "return abs(a);")),
    Case("pow", fn(f"x: {f32(2, 3)}", f32(2, 3), "return pow(x, 1.5);"), positive=True),
    Case("maximum", fn(f"x: {f32(2, 3)}, y: {f32(2, 3)}", f32(2, 3), "return maximum(x, y);")),
    Case("minimum_literal", fn(f"x: {f32(5)}", f32(5), "return minimum(x, 0.25);")),
    Case("maximum_i64", fn(f"a: {i64(5)}, b: {i64(5)}", i64(5), "return maximum(a, b);")),
    Case("minimum", fn(f"a: {i64(5)}, b: {i64(5)}", i64(5), "return minimum(a, b);")),
    Case("mean", fn(f"x: {f32(3, 5)}", f32(3), "return mean(x, axis=1);")),
    Case("min", fn(f"x: {f32(3, 5, 2)}", f32(3, 2), "return min(x, axis=1);")),
    Case("min_i64", fn(f"a: {i64(3, 4)}", i64(4), "return min(a, axis=0);"), id_limit=50),
    Case("where", fn(f"c: {bool_(2, 3)}, x: {f32(2, 3)}", f32(2, 3),
                     "return where(c, x, -1e9);")),
    Case("iota", fn("", i64(2, 3), "return iota(shape=[2, 3], axis=0);")),
    Case("iota_mask", fn(f"x: {f32(1, 4, 4)}", f32(1, 4, 4), "return where(greater(iota("
                         "shape=[1, 4, 4], axis=2), iota(shape=[1, 4, 4], axis=1)), -1e9, x);")),
    Case("cast_f32_bf16", fn(f"x: {f32(6)}", bf16(6), "return cast(x, BF16);")),
    Case("cast_bf16_f32", fn(f"x: {f32(6)}", f32(6), "return cast(cast(x, BF16), F32);")),
    Case("cast_f64_bf16", fn(f"x: {f64(6)}", f32(6), "return cast(cast(x, BF16), F32);")),
    Case("cast_bool", fn(f"x: {f32(6)}", f32(6), "return cast(cast(x, BOOL), F32);")),
    Case("cast_i64", fn(f"x: {f32(6)}", i64(6), "return cast(mul(x, 10.0), I64);")),
    Case("cast_bool_i64", fn(f"c: {bool_(6)}", i64(6), "return cast(c, I64);")),
    Case("layer_norm", fn(f"x: {f32(3, 5)}, g: {f32(5)}, b: {f32(5)}", f32(3, 5),
                          "return layer_norm(x, g, b, axis=1, eps=1e-5);")),
    Case("layer_norm_axis0", fn(f"x: {f32(4, 3)}, g: {f32(4)}, b: {f32(4)}", f32(4, 3),
                                "return layer_norm(x, g, b, axis=0, eps=1e-5);")),
    Case("concat", fn(f"x: {f32(2, 3)}, y: {f32(2, 5)}", f32(2, 11),
                      "return concat(x, y, x, axis=1);")),
    Case("concat_axis0", fn(f"a: {i64(1, 4)}, b: {i64(3, 4)}", i64(4, 4),
                            "return concat(a, b, axis=0);")),
    Case("slice", fn(f"x: {f32(4, 7)}", f32(4, 3), "return slice(x, axis=1, start=2, size=3);")),
    Case("rms_norm", fn(f"x: {f32(2, 3, 6)}, g: {f32(6)}", f32(2, 3, 6),
                        "return rms_norm(x, g, axis=-1, eps=1e-6);")),
]
CASES += [Case(name, fn(f"x: {f32(3, 4)}, y: {f32(3, 4)}", bool_(3, 4),
                        f"return {name}(x, y);"), ties=True)
          for name in ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")]
CASES += [Case("equal_i64", fn(f"a: {i64(5)}", bool_(5), "return equal(a, 2);"))]
# Internal ops (produced by the autodiff transform, not written in Kina) as tensor IR.
CASES += [
    Case("cast_i64_f32", """func @f(%x: i64[2, 3]) -> (f32[2, 3]) {
  %t0 = cast(%x) {dtype = "f32"} : f32[2, 3]
  return %t0
}""", id_limit=1000, ir=True),
    Case("cast_f32_f64", """func @f(%x: f32[4]) -> (f64[4]) {
  %t0 = cast(%x) {dtype = "f64"} : f64[4]
  return %t0
}""", ir=True),
    Case("cast_f64_f32", """func @f(%x: f64[4]) -> (f32[4]) {
  %t0 = cast(%x) {dtype = "f32"} : f32[4]
  return %t0
}""", ir=True),
    Case("scatter_add", """func @f(%u: f32[2, 4, 3], %ids: i64[2, 4]) -> (f32[5, 3]) {
  %t0 = scatter_add(%u, %ids) {rows = 5} : f32[5, 3]
  return %t0
}""", id_limit=5, ir=True),
    Case("scatter_add_rank0_ids", """func @f(%u: f32[3], %ids: i64[]) -> (f32[4, 3]) {
  %t0 = scatter_add(%u, %ids) {rows = 4} : f32[4, 3]
  return %t0
}""", ir=True),
]
CASE_IDS = [case.name for case in CASES]


def case_program(case: Case) -> Program:
    return parse_ir(case.source) if case.ir else program(case.source)


def case_inputs(case: Case, prog: Program) -> list[np.ndarray]:
    function = prog.function(case.entry)
    if function.is_main:
        function = placeholders_to_params(function)
    rng = np.random.default_rng(sum(map(ord, case.name)))
    inputs = []
    for param in function.params:
        shape = param.type.concrete_shape
        dtype = param.type.dtype.numpy
        if param.type.dtype == DType.BOOL:
            inputs.append(rng.random(shape) < 0.5)
        elif not param.type.dtype.is_float:
            inputs.append(rng.integers(0, case.id_limit, size=shape, dtype=np.int64))
        elif case.positive:
            inputs.append(rng.uniform(0.5, 2.0, size=shape).astype(dtype))
        elif case.ties:
            inputs.append(rng.integers(-2, 3, size=shape).astype(dtype))
        else:
            inputs.append(rng.standard_normal(shape).astype(dtype))
    return inputs


def reference_outputs(case: Case, prog: Program, inputs) -> tuple[np.ndarray, ...]:
    if prog.function(case.entry).is_main:
        return interpret(prog, case.entry, placeholders=inputs)
    return interpret(prog, case.entry, *inputs)


# ---- running the lowered MLIR ------------------------------------------------------------------

def _descriptor(array: np.ndarray):
    """A ranked memref descriptor {allocated, aligned, offset, sizes[r], strides[r]}."""
    rank = array.ndim
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
              ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    descriptor = type(f"Memref{rank}", (ctypes.Structure,), {"_fields_": fields})()
    descriptor.allocated = descriptor.aligned = array.ctypes.data
    descriptor.offset = 0
    for axis in range(rank):
        descriptor.sizes[axis] = array.shape[axis]
        descriptor.strides[axis] = array.strides[axis] // array.itemsize
    return descriptor


class LoweredModule:
    """Emitted MLIR lowered by mlir-opt-19 + mlir-translate-19 and JIT-compiled by llvmlite.
    `call(name, function, *inputs)` runs `_mlir_ciface_<name>` (results as out-params)."""

    def __init__(self, text: str):
        import llvmlite.binding as llvm

        from tilegen.target import LLVM_LOCK, host_target, new_target_machine

        llvm_ir = lower_to_llvm_ir(text)
        with LLVM_LOCK:
            module = llvm.parse_assembly(llvm_ir)
            module.verify()
            # The engine owns (and frees) its target machine: never the shared one.
            self._engine = llvm.create_mcjit_compiler(module,
                                                      new_target_machine(host_target()))
            self._engine.finalize_object()
        self._lock = LLVM_LOCK

    def call(self, symbol: str, function, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        with self._lock:
            address = self._engine.get_function_address(f"_mlir_ciface_{symbol}")
        assert address, f"no _mlir_ciface_{symbol} in the lowered module"
        inputs = [np.ascontiguousarray(a) for a in inputs]
        outputs = [np.full(v.type.concrete_shape, -7, dtype=v.type.dtype.numpy)
                   for v in function.results]
        descriptors = [_descriptor(a) for a in inputs + outputs]
        native = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(descriptors)))(address)
        native(*[ctypes.addressof(d) for d in descriptors])
        return tuple(outputs)


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if np.issubdtype(want.dtype, np.integer) or want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=what)


# ---- the registry --------------------------------------------------------------------------

def test_every_op_has_an_mlir_rule():
    missing = sorted(name for name, op in REGISTRY.items() if op.mlir is None)
    assert not missing, f"ops without an MLIR rule (mlir= in their OpDef): {missing}"


def test_every_op_is_covered_by_a_case():
    used = set()
    for case in CASES:
        for function in case_program(case).functions:
            used.update(op.op for op in function.body)
    uncovered = sorted(set(REGISTRY) - used)
    assert not uncovered, f"add a Case using each of: {uncovered}"


def test_missing_rule_is_an_error_naming_the_op(monkeypatch):
    monkeypatch.setitem(REGISTRY, "tanh", dataclasses.replace(REGISTRY["tanh"], mlir=None))
    with pytest.raises(KinaError) as caught:
        emit_mlir(program(fn(f"x: {f32(3)}", f32(3), "return tanh(x);")))
    assert caught.value.kind == "unsupported"
    assert "'tanh'" in caught.value.message and "MLIR" in caught.value.message
    assert caught.value.span is not None and caught.value.line == 1


def test_reverse_mode_without_autodiff_is_a_clear_error(monkeypatch):
    # A None entry in sys.modules makes `import kina_frontend.autodiff` fail as if the module
    # did not exist.
    monkeypatch.setitem(sys.modules, "kina_frontend.autodiff", None)
    with pytest.raises(KinaError) as caught:
        emit_mlir(compile_example("storylm0_nll_step"))
    assert caught.value.kind == "unsupported"
    assert "reverseMode" in caught.value.message and "autodiff" in caught.value.message
    assert caught.value.span is not None


def test_rollout_returns_1x36x8():
    text = emit_mlir(compile_example("storylm0_rollout"))
    head = next(line for line in text.splitlines()
                if line.startswith("func.func @storylm0_rollout("))
    assert head.endswith("-> (tensor<1x36x8xf32>) {")
    assert "%token_ids: tensor<1x36xi64>" in head
    for name, result in (("greedy_row", "tensor<1x1xi64>"), ("sample_row", "tensor<1x1xi64>")):
        assert re.search(rf"func\.func @{name}\(.*\) -> \({re.escape(result)}\) \{{", text)


def test_main_placeholders_become_arguments():
    text = emit_mlir(compile_example("storylm0_rollout"))
    head = next(line for line in text.splitlines() if line.startswith("func.func @main("))
    assert head.count("%") == 12  # the twelve placeholders, in order
    assert head.startswith("func.func @main(%ids: tensor<1x36xi64>, %embed: tensor<8x4xf32>")
    assert head.endswith("-> (tensor<1x36x8xf32>, tensor<1x1xi64>, tensor<1x1xi64>) {")


_OPERATION = re.compile(r"^\s*(?:%[\w.$-]+(?:, %[\w.$-]+)* = )?([a-z]+)\.([a-z_]+)", re.M)


def test_only_the_promised_dialects():
    allowed = {"func", "linalg", "tensor", "arith", "math"}
    for name in ("storylm0_forward", "storylm0_rollout"):
        dialects = {m.group(1) for m in _OPERATION.finditer(emit_mlir(compile_example(name)))}
        assert dialects <= allowed, (name, dialects - allowed)
    for case in CASES:
        dialects = {m.group(1) for m in _OPERATION.finditer(emit_mlir(case_program(case)))}
        assert dialects <= allowed, (case.name, dialects - allowed)


# ---- goldens --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_golden(name):
    text = emit_example(name)
    path = GOLDEN_DIR / f"{name}.mlir"
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run TILEGEN_UPDATE_GOLDENS=1 python -m pytest " \
                          f"tests/test_mlir.py to create it"
    assert text == path.read_text(), f"{path.name} differs from the emitted MLIR; if the " \
        "change is intended, regenerate with TILEGEN_UPDATE_GOLDENS=1 python -m pytest " \
        "tests/test_mlir.py"


def test_cli_emit_mlir_prints_the_golden():
    result = subprocess.run([sys.executable, "-m", "tilegen.compile", "storylm0_rollout.kina",
                             "--emit", "mlir"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN_DIR / "storylm0_rollout.mlir").read_text()


def golden_files() -> list[Path]:
    return sorted(GOLDEN_DIR.glob("*.mlir"))


def test_there_are_goldens():
    names = {p.stem for p in golden_files()}
    assert {"storylm0_forward", "storylm0_rollout"} <= names


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.name)
def test_mlir_opt_accepts_golden(path):
    require_tool(MLIR_OPT)
    text = path.read_text()
    verified = run_mlir_opt(text, "--verify-each")
    assert verified.returncode == 0, f"{MLIR_OPT} rejected {path.name}:\n{verified.stderr}"
    lowered = run_mlir_opt(text, *LOWERING_PIPELINE)
    assert lowered.returncode == 0, f"{MLIR_OPT} could not lower {path.name}:\n" \
                                    f"{lowered.stderr}"


# ---- every op through mlir-opt, and run --------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mlir_opt_accepts_op_program(case):
    require_tool(MLIR_OPT)
    text = emit_mlir(case_program(case))
    verified = run_mlir_opt(text, "--verify-each")
    assert verified.returncode == 0, f"{MLIR_OPT} rejected:\n{verified.stderr}\n{text}"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_lowered_op_program_matches_interpreter(case):
    require_tool(MLIR_OPT)
    require_tool(MLIR_TRANSLATE)
    prog = case_program(case)
    inputs = case_inputs(case, prog)
    want = reference_outputs(case, prog, inputs)
    module = LoweredModule(emit_mlir(prog))
    function = prog.function(case.entry)
    if function.is_main:
        function = placeholders_to_params(function)
    got = module.call(case.entry, function, *inputs)
    assert len(got) == len(want)
    for position, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, f"{case.name} result {position}")


def test_lowered_storylm0_matches_numpy_reference():
    """The forward and rollout goldens, run: logits match storylm.reference, and the greedy
    and sampled row decoders match it on rows taken from those logits."""
    require_tool(MLIR_OPT)
    require_tool(MLIR_TRANSLATE)
    from storylm import reference
    from storylm.fixture import causal_mask, load_checkpoint

    checkpoint = load_checkpoint()
    weights = (checkpoint.embed, None, checkpoint.scale, checkpoint.wq, checkpoint.wk,
               checkpoint.wv, checkpoint.wo, checkpoint.lm_head)
    for name, length in (("storylm0_forward", 4), ("storylm0_rollout", 36)):
        module = LoweredModule((GOLDEN_DIR / f"{name}.mlir").read_text())
        prog = compile_example(name)
        ids = np.zeros((1, length), dtype=np.int64)
        ids[0, :4] = [1, 4, 2, 6]
        args = [ids, weights[0], causal_mask(length), *weights[2:]]
        (logits,) = module.call(name, prog.function(name), *args)
        want = reference.forward(*args)
        np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
        if name != "storylm0_rollout":
            continue
        stream = np.random.RandomState(reference.SAMPLING_SEED)
        temperature = np.full((1, 1), reference.SAMPLING_TEMPERATURE, dtype=np.float32)
        for step in range(4):
            row = np.ascontiguousarray(logits[:, 3 + step:4 + step, :])
            u = reference.uniform_row(stream)
            (greedy,) = module.call("greedy_row", prog.function("greedy_row"), row)
            (sampled,) = module.call("sample_row", prog.function("sample_row"), row, u,
                                     temperature)
            assert greedy[0, 0] == reference.greedy_row(row)
            assert sampled[0, 0] == reference.sample_row(row, u, temperature)


def test_lowered_nll_step_matches_numpy_reference():
    """The training-step golden (reverseMode expanded by the autodiff transform), run: the
    loss and the six SGD-updated weights match storylm.reference.nll_step."""
    require_tool(MLIR_OPT)
    require_tool(MLIR_TRANSLATE)
    path = GOLDEN_DIR / "storylm0_nll_step.mlir"
    from storylm import reference
    from storylm.fixture import causal_mask, load_checkpoint, load_corpus

    checkpoint = load_checkpoint()
    window = load_corpus()[0]
    args = [window.id_array(), window.target_array(), checkpoint.embed, checkpoint.wq,
            checkpoint.wk, checkpoint.wv, checkpoint.wo, checkpoint.lm_head, causal_mask(4),
            checkpoint.scale, np.full((1, 1), 0.1, dtype=np.float32)]
    module = LoweredModule(path.read_text())
    prog = compile_example("storylm0_nll_step")
    got = module.call("storylm0_nll_step", prog.function("storylm0_nll_step"), *args)
    want = reference.nll_step(*args)
    assert len(got) == len(want) == 7
    for position, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6,
                                   err_msg=f"storylm0_nll_step result {position}")


# ---- randomly generated programs (tests/progen.py) through MLIR ----------------------------

GENERATED_BLOCKS = 4
GENERATED_PER_BLOCK = 12


@pytest.mark.parametrize("block", range(GENERATED_BLOCKS))
def test_lowered_generated_programs_match_interpreter(block):
    """Random well-typed programs (2 to 14 ops over odd sizes): emitted, verified and lowered
    by mlir-opt-19, run, and compared with the reference interpreter."""
    require_tool(MLIR_OPT)
    require_tool(MLIR_TRANSLATE)
    from .progen import generate_program

    first = 50_000 + block * GENERATED_PER_BLOCK
    for seed in range(first, first + GENERATED_PER_BLOCK):
        generated = generate_program(np.random.default_rng(seed), 2 + seed % 13)
        prog = program(generated.source)
        want = interpret(prog, generated.function, *generated.inputs)
        module = LoweredModule(emit_mlir(prog))
        got = module.call(generated.function, prog.function(generated.function),
                          *generated.inputs)
        for w, g in zip(want, got, strict=True):
            if w.dtype == np.int64:
                np.testing.assert_array_equal(g, w, err_msg=generated.source)
                continue
            finite = w[np.isfinite(w)]
            scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * scale, equal_nan=True,
                                       err_msg=generated.source)
