"""reverseMode: every vjp rule, composite programs, compiled gradients, simplify, verify.

- Per op (a walk over the registry): the gradient of sum(op(args) * c) for a random
  cotangent c, from the transform through the reference interpreter in float64, against
  central finite differences of the same interpreter, and against torch.autograd when
  PyTorch is importable. Shapes come from hypothesis.
- Composite programs: nested calls, values used many times, wrt subsets and order,
  unused parameters, gradients of gradients, StoryLM-0 against its hand-derived NumPy
  gradient.
- The transformed IR passes the verifier; tilegen-compiled gradients equal the
  interpreter's; the simplifier's patterns each do what they say and change no number.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import (
    KinaError,
    interpret,
    load_program,
    parse_ir,
    program_from_text,
    specialize,
)
from kina_frontend.autodiff import active_values, gradient_function
from kina_frontend.ops import REGISTRY
from kina_frontend.simplify import PATTERNS, simplify_function
from kina_frontend.tensor_ir import format_function
from kina_frontend.verify import IRVerifyError, verify_function, verify_program

SIZES = st.sampled_from([1, 2, 3])
SEEDS = st.integers(0, 2**31 - 1)
FD_STEP = 1e-6
FD_SETTINGS = settings(max_examples=12, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow])


def ktype(shape, dtype="F64") -> str:
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


# ---- per-op cases -----------------------------------------------------------------------------

TORCH_UNARY = {
    "relu": lambda torch, a: torch.relu(a),
    "gelu": lambda torch, a: torch.nn.functional.gelu(a),
    "gelu_tanh": lambda torch, a: torch.nn.functional.gelu(a, approximate="tanh"),
    "erf": lambda torch, a: torch.erf(a),
    "sigmoid": lambda torch, a: torch.sigmoid(a),
    "silu": lambda torch, a: torch.nn.functional.silu(a),
    "rsqrt": lambda torch, a: torch.rsqrt(a),
    "abs": lambda torch, a: torch.abs(a),
}

@dataclass(frozen=True)
class Arg:
    name: str
    shape: tuple[int, ...]
    kind: str = "float"  # float | positive | nonzero | ids | mask
    limit: int = 0  # ids lie in [0, limit)

    @property
    def dtype(self) -> str:
        return {"ids": "I64", "mask": "BOOL"}.get(self.kind, "F64")

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "ids":
            return rng.integers(0, self.limit, size=self.shape, dtype=np.int64)
        if self.kind == "mask":
            return rng.random(self.shape) < 0.5
        if self.kind == "positive":
            return rng.uniform(0.5, 2.0, size=self.shape)
        if self.kind == "nonzero":
            return rng.uniform(0.5, 2.0, size=self.shape) * rng.choice([-1.0, 1.0], self.shape)
        return rng.standard_normal(self.shape)


@dataclass(frozen=True)
class OpCase:
    """`expr` (Kina, over the args' names) of shape `out`; `torch_fn(torch, tensors)` is the
    same computation in PyTorch."""

    expr: str
    args: tuple[Arg, ...]
    out: tuple[int, ...]
    torch_fn: object

    @property
    def wrt(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.kind not in ("ids", "mask"))


def _shape(draw, rank_min=1, rank_max=3) -> tuple[int, ...]:
    return tuple(draw(SIZES) for _ in range(draw(st.integers(rank_min, rank_max))))


@st.composite
def op_cases(draw, opname: str) -> OpCase:
    if opname in ("add", "sub", "mul", "div"):
        shape = _shape(draw)
        symbol = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "div": "__truediv__"}
        rhs_kind = "nonzero" if opname == "div" else "float"
        literal = draw(st.sampled_from([None, "lhs", "rhs"]))
        if literal == "lhs":  # a number literal operand becomes a fill
            return OpCase(f"{opname}(1.5, a)", (Arg("a", shape, rhs_kind),), shape,
                          lambda torch, t: getattr(torch.full_like(t["a"], 1.5),
                                                   symbol[opname])(t["a"]))
        if literal == "rhs":
            return OpCase(f"{opname}(a, -2.5)", (Arg("a", shape),), shape,
                          lambda torch, t: getattr(t["a"], symbol[opname])(-2.5))
        return OpCase(f"{opname}(a, b)", (Arg("a", shape), Arg("b", shape, rhs_kind)), shape,
                      lambda torch, t: getattr(t["a"], symbol[opname])(t["b"]))
    if opname in ("neg", "exp", "log", "sqrt", "tanh"):
        shape = _shape(draw)
        kind = "positive" if opname in ("log", "sqrt") else "float"
        return OpCase(f"{opname}(a)", (Arg("a", shape, kind),), shape,
                      lambda torch, t: getattr(torch, opname)(t["a"]))
    if opname in TORCH_UNARY:
        shape = _shape(draw)
        kind = "positive" if opname == "rsqrt" else "nonzero" if opname in ("relu", "abs") \
            else "float"
        return OpCase(f"{opname}(a)", (Arg("a", shape, kind),), shape,
                      lambda torch, t: TORCH_UNARY[opname](torch, t["a"]))
    if opname == "pow":
        shape = _shape(draw)
        p = draw(st.sampled_from([2.0, 3.0, -1.0, 0.5, 1.7, -2.25]))
        return OpCase(f"pow(a, {p})", (Arg("a", shape, "positive"),), shape,
                      lambda torch, t: torch.pow(t["a"], p))
    if opname in ("maximum", "minimum"):
        shape = _shape(draw)
        if draw(st.booleans()):
            return OpCase(f"{opname}(a, 0.25)", (Arg("a", shape, "nonzero"),), shape,
                          lambda torch, t: getattr(torch, opname)(
                              t["a"], torch.full_like(t["a"], 0.25)))
        return OpCase(f"{opname}(a, b)", (Arg("a", shape), Arg("b", shape)), shape,
                      lambda torch, t: getattr(torch, opname)(t["a"], t["b"]))
    if opname in ("layer_norm", "rms_norm"):
        shape = _shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        width = (shape[axis],)
        if shape[axis] == 1:  # a one-element row normalises to 0: no gradient to check
            shape = shape[:axis % len(shape)] + (3,) + shape[axis % len(shape) + 1:]
            width = (3,)
        args = (Arg("a", shape), Arg("g", width)) + ((Arg("b", width),)
                                                    if opname == "layer_norm" else ())
        names = ", ".join(a.name for a in args)

        def torch_norm(torch, t):
            x = t["a"].movedim(axis, -1)
            if opname == "layer_norm":
                y = torch.nn.functional.layer_norm(x, width, t["g"], t["b"], 0.01)
            else:
                y = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 0.01) * t["g"]
            return y.movedim(-1, axis)
        return OpCase(f"{opname}({names}, axis={axis}, eps=0.01)", args, shape, torch_norm)
    if opname == "concat":
        shape = _shape(draw)
        axis = draw(st.integers(0, len(shape) - 1))
        widths = [draw(SIZES) for _ in range(draw(st.integers(1, 3)))]
        args = tuple(Arg(f"x{k}", shape[:axis] + (w,) + shape[axis + 1:])
                     for k, w in enumerate(widths))
        out = shape[:axis] + (sum(widths),) + shape[axis + 1:]
        return OpCase(f"concat({', '.join(a.name for a in args)}, axis={axis})", args, out,
                      lambda torch, t: torch.cat([t[a.name] for a in args], dim=axis))
    if opname == "slice":
        shape = _shape(draw)
        axis = draw(st.integers(0, len(shape) - 1))
        start = draw(st.integers(0, shape[axis] - 1))
        size = draw(st.integers(1, shape[axis] - start))
        out = shape[:axis] + (size,) + shape[axis + 1:]
        return OpCase(f"slice(a, axis={axis}, start={start}, size={size})", (Arg("a", shape),),
                      out, lambda torch, t: t["a"].narrow(axis, start, size))
    if opname == "where":
        shape = _shape(draw)
        return OpCase("where(keep, a, b)", (Arg("keep", shape, "mask"), Arg("a", shape),
                                             Arg("b", shape)), shape,
                      lambda torch, t: torch.where(t["keep"], t["a"], t["b"]))
    if opname == "gather":
        rows, width = draw(SIZES), draw(SIZES)
        ids_shape = _shape(draw, 1, 2)
        return OpCase("gather(table, ids)",
                      (Arg("table", (rows, width)), Arg("ids", ids_shape, "ids", rows)),
                      ids_shape + (width,), lambda torch, t: t["table"][t["ids"]])
    if opname == "scatter_add":
        rows, width = draw(SIZES), draw(SIZES)
        ids_shape = _shape(draw, 1, 2)
        return OpCase(f"scatter_add(u, ids, {rows})",
                      (Arg("u", ids_shape + (width,)), Arg("ids", ids_shape, "ids", rows)),
                      (rows, width),
                      lambda torch, t: torch.zeros(rows, width, dtype=t["u"].dtype).index_add(
                          0, t["ids"].reshape(-1), t["u"].reshape(-1, width)))
    if opname == "broadcast":
        shape = _shape(draw, 1, 2)
        source = tuple(1 if draw(st.booleans()) else d for d in shape)
        target = (draw(SIZES),) + shape
        return OpCase(f"broadcast(a, {list(target)})", (Arg("a", source),), target,
                      lambda torch, t: t["a"].broadcast_to(target))
    if opname == "reshape":
        shape = _shape(draw)
        total = int(np.prod(shape))
        first = draw(st.sampled_from([d for d in range(1, total + 1) if total % d == 0]))
        target = (first, total // first)
        return OpCase(f"reshape(a, {list(target)})", (Arg("a", shape),), target,
                      lambda torch, t: t["a"].reshape(target))
    if opname == "transpose":
        shape = _shape(draw, 2, 4)
        perm = tuple(draw(st.permutations(range(len(shape)))))
        return OpCase(f"transpose(a, {list(perm)})", (Arg("a", shape),),
                      tuple(shape[p] for p in perm), lambda torch, t: t["a"].permute(perm))
    if opname == "matmul":
        rank = draw(st.integers(2, 4))
        batch = tuple(draw(SIZES) for _ in range(rank - 2))
        m, k, n = draw(SIZES), draw(st.sampled_from([1, 2, 3, 4])), draw(SIZES)
        return OpCase("matmul(a, b)", (Arg("a", batch + (m, k)), Arg("b", batch + (k, n))),
                      batch + (m, n), lambda torch, t: t["a"] @ t["b"])
    if opname in ("sum", "mean", "max", "min", "softmax", "log_softmax"):
        shape = _shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        keep = opname in ("softmax", "log_softmax")
        out = shape if keep else shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
        torch_fns = {"sum": lambda torch, t: t["a"].sum(dim=axis),
                     "mean": lambda torch, t: t["a"].mean(dim=axis),
                     "max": lambda torch, t: t["a"].max(dim=axis).values,
                     "min": lambda torch, t: t["a"].min(dim=axis).values,
                     "softmax": lambda torch, t: torch.softmax(t["a"], dim=axis),
                     "log_softmax": lambda torch, t: torch.log_softmax(t["a"], dim=axis)}
        return OpCase(f"{opname}(a, axis={axis})", (Arg("a", shape),), out, torch_fns[opname])
    raise KeyError(opname)


# Ops with a case above; `cast` is internal (not writable in Kina source) and is tested on
# tensor IR in test_cast_vjp.
GRADIENT_CASES = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "gather",
                  "scatter_add", "broadcast", "reshape", "transpose", "matmul", "sum", "max",
                  "softmax", "log_softmax", "pow", "maximum", "minimum", "where", "mean",
                  "min", "layer_norm", "rms_norm", "concat", "slice") + tuple(TORCH_UNARY)
IR_GRADIENT_CASES = ("cast",)


def test_every_differentiable_op_has_a_vjp_and_a_gradient_test():
    missing_rule = sorted(n for n, op in REGISTRY.items() if op.differentiable and op.vjp is None)
    assert not missing_rule, f"differentiable ops without a vjp rule: {missing_rule}"
    tested = set(GRADIENT_CASES) | set(IR_GRADIENT_CASES)
    untested = sorted(n for n, op in REGISTRY.items() if op.differentiable and n not in tested)
    assert not untested, f"differentiable ops without a gradient test: {untested}"
    stale = sorted(tested - {n for n, op in REGISTRY.items() if op.differentiable})
    assert not stale, f"gradient tests for ops that are not differentiable: {stale}"


def test_non_differentiable_ops_have_no_vjp():
    for name, op in REGISTRY.items():
        if not op.differentiable:
            assert op.vjp is None, name


def _sum_all(expr: str, rank: int) -> str:
    for axis in reversed(range(rank)):
        expr = f"sum({expr}, axis={axis})"
    return expr


def case_program(case: OpCase) -> str:
    """op_f (the op), loss = sum(op_f(args) * c) and grad = reverseMode(loss, wrt=floats)."""
    params = ", ".join(f"{a.name}: {ktype(a.shape, a.dtype)}" for a in case.args)
    names = ", ".join(a.name for a in case.args)
    wrt = ", ".join(a.name for a in case.wrt)
    results = ", ".join([ktype(())] + [ktype(a.shape) for a in case.wrt])
    bound = ", ".join(["value"] + [f"d_{a.name}" for a in case.wrt])
    return textwrap.dedent(f"""\
        fn op_f({params}) -> {ktype(case.out)} {{
          return {case.expr};
        }}
        fn loss({params}, c: {ktype(case.out)}) -> {ktype(())} {{
          return {_sum_all(f"mul(op_f({names}), c)", len(case.out))};
        }}
        fn grad({params}, c: {ktype(case.out)}) -> ({results}) {{
          let ({bound}) = reverseMode(loss, wrt=[{wrt}])({names}, c);
          return ({bound});
        }}
        """)


def case_inputs(case: OpCase, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [a.sample(rng) for a in case.args] + [rng.standard_normal(case.out)]


def finite_difference(program, name: str, inputs: list[np.ndarray], position: int) -> np.ndarray:
    """Central differences of the scalar function `name` in input `position`."""
    base = inputs[position]
    gradient = np.zeros_like(base)
    for index in np.ndindex(*base.shape):
        values = []
        for step in (FD_STEP, -FD_STEP):
            shifted = base.copy()
            shifted[index] += step
            args = list(inputs)
            args[position] = shifted
            (value,) = interpret(program, name, *args)
            values.append(float(value))
        gradient[index] = (values[0] - values[1]) / (2 * FD_STEP)
    return gradient


def assert_gradients_close(got, want, what: str, rtol=1e-5, atol=1e-6) -> None:
    scale = max(1.0, float(np.max(np.abs(want)))) if np.size(want) else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


@pytest.mark.parametrize("opname", GRADIENT_CASES)
@FD_SETTINGS
@given(data=st.data(), seed=SEEDS)
def test_vjp_matches_finite_differences(opname, data, seed):
    case = data.draw(op_cases(opname))
    program = program_from_text(case_program(case))
    inputs = case_inputs(case, seed)
    value, *grads = interpret(program, "grad", *inputs)
    (loss,) = interpret(program, "loss", *inputs)
    assert float(value) == float(loss)
    for arg, grad in zip(case.wrt, grads, strict=True):
        position = case.args.index(arg)
        want = finite_difference(program, "loss", inputs, position)
        assert_gradients_close(grad, want, f"{opname}: d loss / d {arg.name}\n{case.expr}")


@pytest.mark.parametrize("opname", GRADIENT_CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=SEEDS)
def test_vjp_matches_torch_autograd(opname, data, seed):
    torch = pytest.importorskip("torch")
    case = data.draw(op_cases(opname))
    program = program_from_text(case_program(case))
    inputs = case_inputs(case, seed)
    value, *grads = interpret(program, "grad", *inputs)
    tensors = {a.name: torch.tensor(x, requires_grad=a.kind not in ("ids", "mask"))
               for a, x in zip(case.args, inputs, strict=False)}
    cotangent = torch.tensor(inputs[-1])
    loss = (case.torch_fn(torch, tensors) * cotangent).sum()
    loss.backward()
    np.testing.assert_allclose(float(value), loss.item(), rtol=1e-12, atol=1e-12)
    for arg, grad in zip(case.wrt, grads, strict=True):
        assert_gradients_close(grad, tensors[arg.name].grad.numpy(),
                               f"{opname}: d/d {arg.name} vs torch\n{case.expr}",
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("opname", GRADIENT_CASES)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=SEEDS)
def test_compiled_gradient_matches_interpreter(opname, data, seed):
    from tilegen.api import compile_program

    case = data.draw(op_cases(opname))
    program = program_from_text(case_program(case))
    inputs = case_inputs(case, seed)
    expected = interpret(program, "grad", *inputs)
    got = compile_program(program, jit=True, names=("grad",)).grad(*inputs)
    for index, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_gradients_close(g, e, f"{opname}: result {index}", rtol=1e-12, atol=1e-13)


# ---- cast (internal: written as tensor IR) ------------------------------------------------

CAST_IR = """\
func @loss(%x: f64[5], %c: f64[5]) -> (f64[]) {
  %y = cast(%x) {dtype = "f32"} : f32[5]
  %z = cast(%y) {dtype = "f64"} : f64[5]
  %p = mul(%z, %c) : f64[5]
  %s = sum(%p) {axis = 0} : f64[]
  return %s
}
"""


def test_cast_vjp():
    # d/dx sum(f64(f32(x)) * c) is c, carried through f32: the cotangent is cast back on each
    # step, so it is c rounded to float32 (the forward rounding has derivative 1 a.e.).
    program = parse_ir(CAST_IR)
    gradient = gradient_function(program, "loss", (0,))
    verify_program(gradient.program)
    rng = np.random.default_rng(3)
    x, c = rng.standard_normal(5), rng.standard_normal(5)
    _, grad = interpret(gradient.program, gradient.name, x, c)
    np.testing.assert_array_equal(grad, c.astype(np.float32).astype(np.float64))
    fd = finite_difference(program, "loss", [x, c], 0)  # f32 rounding: a coarse agreement
    np.testing.assert_allclose(fd, c, rtol=0.05, atol=0.05)


# ---- composite programs -------------------------------------------------------------------

COMPOSITE = """
const N = 3;
const K = 4;
const M = 2;

fn inner(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host])
    -> Tensor[F64, [N, M], @host] {
  return tanh(matmul(x, w));
}

fn middle(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host],
          b: Tensor[F64, [N, M], @host]) -> Tensor[F64, [N, M], @host] {
  let h = inner(x, w);                      // h is used three times
  return add(mul(h, h), div(mul(h, b), 2.0));
}

fn loss(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host],
        b: Tensor[F64, [N, M], @host], unused: Tensor[F64, [M], @host])
    -> Tensor[F64, [], @host] {
  let y = middle(x, w, b);                  // y is used twice, x twice
  let z = add(y, matmul(x, broadcast(reshape(sum(w, axis=1), [K, 1]), [K, M])));
  return sum(sum(mul(z, exp(neg(y))), axis=1), axis=0);
}

fn grad_all(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host],
            b: Tensor[F64, [N, M], @host], unused: Tensor[F64, [M], @host])
    -> (Tensor[F64, [], @host], Tensor[F64, [N, K], @host], Tensor[F64, [K, M], @host],
        Tensor[F64, [N, M], @host], Tensor[F64, [M], @host]) {
  return reverseMode(loss, wrt=[x, w, b, unused])(x, w, b, unused);
}

fn grad_b_x(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host],
            b: Tensor[F64, [N, M], @host], unused: Tensor[F64, [M], @host])
    -> (Tensor[F64, [], @host], Tensor[F64, [N, M], @host], Tensor[F64, [N, K], @host]) {
  return reverseMode(loss, wrt=[b, x])(x, w, b, unused);
}

fn grad_w(x: Tensor[F64, [N, K], @host], w: Tensor[F64, [K, M], @host],
          b: Tensor[F64, [N, M], @host], unused: Tensor[F64, [M], @host])
    -> (Tensor[F64, [], @host], Tensor[F64, [K, M], @host]) {
  return reverseMode(loss, wrt=[w])(x, w, b, unused);
}
"""


def composite_torch(torch, x, w, b, unused):
    h = torch.tanh(x @ w)
    y = h * h + h * b / 2.0
    z = y + x @ w.sum(dim=1, keepdim=True).broadcast_to(w.shape)
    return (z * torch.exp(-y)).sum() + 0 * unused.sum()


def composite_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in ((3, 4), (4, 2), (3, 2), (2,))]


@pytest.fixture(scope="module")
def composite_program():
    return program_from_text(COMPOSITE, "composite.kina")


def test_composite_gradients_match_finite_differences(composite_program):
    inputs = composite_inputs()
    value, *grads = interpret(composite_program, "grad_all", *inputs)
    assert float(value) == float(interpret(composite_program, "loss", *inputs)[0])
    for position, grad in enumerate(grads):
        want = finite_difference(composite_program, "loss", inputs, position)
        assert_gradients_close(grad, want, f"d loss / d input {position}")
    np.testing.assert_array_equal(grads[3], np.zeros(2))  # `unused` gets zeros


def test_wrt_subsets_come_back_in_wrt_order(composite_program):
    inputs = composite_inputs(1)
    value, gx, gw, gb, _ = interpret(composite_program, "grad_all", *inputs)
    value_bx, gb2, gx2 = interpret(composite_program, "grad_b_x", *inputs)
    value_w, gw2 = interpret(composite_program, "grad_w", *inputs)
    assert float(value) == float(value_bx) == float(value_w)
    np.testing.assert_allclose(gb2, gb, rtol=1e-14)
    np.testing.assert_allclose(gx2, gx, rtol=1e-14)
    np.testing.assert_allclose(gw2, gw, rtol=1e-14)


def test_composite_gradients_match_torch(composite_program):
    torch = pytest.importorskip("torch")
    inputs = composite_inputs(2)
    value, *grads = interpret(composite_program, "grad_all", *inputs)
    tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
    loss = composite_torch(torch, *tensors)
    loss.backward()
    assert float(value) == pytest.approx(loss.item(), rel=1e-13)
    for tensor, grad in zip(tensors, grads, strict=True):
        np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=1e-11, atol=1e-13)


def test_composite_gradient_compiles_and_matches_interpreter(composite_program):
    from tilegen.api import compile_program

    module = compile_program(composite_program, jit=True, names=("grad_all", "grad_b_x"))
    inputs = composite_inputs(3)
    for name in ("grad_all", "grad_b_x"):
        expected = interpret(composite_program, name, *inputs)
        got = getattr(module, name)(*inputs)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)


def test_compiled_gradient_with_large_temporaries():
    # Gradients keep many forward values alive; several temporaries here exceed tilegen's
    # stack limit and are malloc'ed (regression: the frees were not dominated by the mallocs
    # when a kernel had two heap temporaries, and LLVM rejected the IR).
    from tilegen.api import compile_program

    program = program_from_text(f"""
        fn loss(x: {ktype((256, 96), "F32")}, w: {ktype((96, 128), "F32")}) -> {ktype((), "F32")} {{
          let h = tanh(matmul(x, w));
          return sum(sum(mul(softmax(h, axis=1), h), axis=1), axis=0);
        }}
        fn g(x: {ktype((256, 96), "F32")}, w: {ktype((96, 128), "F32")})
            -> ({ktype((), "F32")}, {ktype((96, 128), "F32")}) {{
          return reverseMode(loss, wrt=[w])(x, w);
        }}
        """)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((256, 96)) * 0.1).astype(np.float32)
    w = (rng.standard_normal((96, 128)) * 0.1).astype(np.float32)
    expected = interpret(program, "g", x, w)
    got = compile_program(program, jit=True, names=("g",)).g(x, w)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-4, atol=1e-6)


def test_transformed_ir_passes_the_verifier(composite_program):
    for callee, wrt in (("loss", (0, 1, 2, 3)), ("loss", (2, 0)), ("middle", (1,))):
        gradient = gradient_function(composite_program, callee, wrt)
        verify_program(gradient.program)
        function = gradient.function
        assert function.name == f"{callee}__grad_" + "_".join(str(i) for i in wrt)
        original = composite_program.function(callee)
        assert function.params == original.params
        assert function.result_types == original.result_types + tuple(
            original.params[i].type for i in wrt)
        assert not any(op.op in ("call", "reverse_mode") for op in function.body)


def test_symbolic_program_transforms_and_verifies():
    # Before specialisation dims are sympy expressions over the consts; the transform and
    # the verifier prove shapes for every value of N, K, M.
    from kina_frontend import Source, check_source

    checked = check_source(Source("composite.kina", COMPOSITE))
    gradient = gradient_function(checked.program, "loss", (0, 1, 2))
    verify_program(gradient.program)
    assert any(not isinstance(d, int) for v in gradient.function.params for d in v.type.shape)


def test_seed_is_ones_of_the_result_shape():
    # A non-scalar result: the gradient is the vjp with a ones cotangent, 2x for x * x.
    program = program_from_text(f"""
        fn square(x: {ktype((2, 3))}) -> {ktype((2, 3))} {{ return mul(x, x); }}
        fn g(x: {ktype((2, 3))}) -> ({ktype((2, 3))}, {ktype((2, 3))}) {{
          return reverseMode(square, wrt=[x])(x);
        }}
        fn ident(x: {ktype((2, 3))}) -> {ktype((2, 3))} {{ return x; }}
        fn gi(x: {ktype((2, 3))}) -> ({ktype((2, 3))}, {ktype((2, 3))}) {{
          return reverseMode(ident, wrt=[x])(x);
        }}
        """)
    x = np.arange(6.0).reshape(2, 3) - 2.5
    value, grad = interpret(program, "g", x)
    np.testing.assert_array_equal(value, x * x)
    np.testing.assert_array_equal(grad, 2 * x)
    value, grad = interpret(program, "gi", x)
    np.testing.assert_array_equal(value, x)
    np.testing.assert_array_equal(grad, np.ones_like(x))


def test_gradient_of_a_gradient():
    # g(x) = sum((d/dx sum(x^3))^2) = 9 sum(x^4), so dg/dx = 36 x^3: reverseMode inside a
    # function that is itself differentiated.
    program = program_from_text(f"""
        fn cube(x: {ktype((3,))}) -> {ktype(())} {{ return sum(mul(mul(x, x), x), axis=0); }}
        fn g(x: {ktype((3,))}) -> {ktype(())} {{
          let (y, dx) = reverseMode(cube, wrt=[x])(x);
          return sum(mul(dx, dx), axis=0);
        }}
        fn h(x: {ktype((3,))}) -> ({ktype(())}, {ktype((3,))}) {{
          return reverseMode(g, wrt=[x])(x);
        }}
        """)
    x = np.array([1.0, -2.0, 0.5])
    value, grad = interpret(program, "h", x)
    assert float(value) == pytest.approx(9 * np.sum(x ** 4))
    np.testing.assert_allclose(grad, 36 * x ** 3, rtol=1e-14)


def test_max_sends_the_cotangent_to_the_first_maximum():
    for dtype in ("F32", "F64"):  # F64 goes through cast(one_hot(argmax))
        program = program_from_text(f"""
            fn m(x: {ktype((3, 4), dtype)}) -> {ktype((), dtype)} {{
              return sum(max(x, axis=0), axis=0);
            }}
            fn g(x: {ktype((3, 4), dtype)}) -> ({ktype((), dtype)}, {ktype((3, 4), dtype)}) {{
              return reverseMode(m, wrt=[x])(x);
            }}
            """)
        x = np.array([[1, 5, 2, 2], [3, 5, 0, 2], [3, 1, 0, 1]],
                     dtype={"F32": np.float32, "F64": np.float64}[dtype])
        value, grad = interpret(program, "g", x)
        assert float(value) == 12.0
        np.testing.assert_array_equal(grad, [[0, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_gather_gradient_accumulates_repeated_ids():
    program = program_from_text(f"""
        fn pick(t: {ktype((4, 2))}, ids: {ktype((5,), "I64")}) -> {ktype(())} {{
          return sum(sum(gather(t, ids), axis=1), axis=0);
        }}
        fn g(t: {ktype((4, 2))}, ids: {ktype((5,), "I64")}) -> ({ktype(())}, {ktype((4, 2))}) {{
          return reverseMode(pick, wrt=[t])(t, ids);
        }}
        """)
    ids = np.array([2, 0, 2, 2, 3], np.int64)
    _, grad = interpret(program, "g", np.zeros((4, 2)), ids)
    np.testing.assert_array_equal(grad, [[1, 1], [0, 0], [3, 3], [1, 1]])


def test_missing_vjp_is_a_diagnostic_naming_the_op(monkeypatch):
    monkeypatch.setitem(REGISTRY, "tanh", dataclasses.replace(REGISTRY["tanh"], vjp=None))
    source = f"""fn f(x: {ktype((2,))}) -> {ktype((2,))} {{ return tanh(x); }}
fn g(x: {ktype((2,))}) -> ({ktype((2,))}, {ktype((2,))}) {{
  return reverseMode(f, wrt=[x])(x);
}}
"""
    program = program_from_text(source, "nodiff.kina")
    with pytest.raises(KinaError) as error:
        gradient_function(program, "f", (0,))
    assert error.value.kind == "autodiff"
    assert "'tanh' has no vector-Jacobian rule" in error.value.message
    assert str(error.value.span) == f"nodiff.kina:1:{source.index('tanh(x)') + 1}"


def test_integer_parameters_are_rejected_in_wrt():
    program = program_from_text(f"""
        fn f(t: {ktype((4, 2))}, ids: {ktype((3,), "I64")}) -> {ktype(())} {{
          return sum(sum(gather(t, ids), axis=1), axis=0);
        }}
        """)
    with pytest.raises(KinaError, match="cannot differentiate with respect to 'ids'"):
        gradient_function(program, "f", (1,))


def test_only_active_values_get_cotangents(composite_program):
    function = composite_program.function("inner")
    assert active_values(function, ()) == set()
    active = active_values(function, (1,))
    assert "w" in active and "x" not in active


def test_transform_is_cached_per_program(composite_program):
    first = gradient_function(composite_program, "loss", (0,))
    assert gradient_function(composite_program, "loss", [0]) is first
    assert gradient_function(composite_program, "loss", (1,)) is not first


# ---- StoryLM-0 --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def storylm_step():
    from storylm import fixture

    program = specialize(load_program("storylm0_nll_step.kina"))
    checkpoint = fixture.load_checkpoint()
    arrays = checkpoint.arrays()
    window = fixture.load_corpus()[1]
    args = (window.id_array(), window.target_array(), arrays["embed"], arrays["wq"],
            arrays["wk"], arrays["wv"], arrays["wo"], arrays["lm_head"],
            fixture.causal_mask(4), arrays["scale"])
    return program, args


def test_storylm_gradient_matches_hand_derived_numpy(storylm_step):
    from storylm import reference

    program, args = storylm_step
    gradient = gradient_function(program, "storylm0_nll", (2, 3, 4, 5, 6, 7))
    verify_program(gradient.program)
    nll, *grads = interpret(gradient.program, gradient.name, *args)
    want_nll, want = reference.nll_and_grads(*args)
    assert float(nll) == pytest.approx(float(want_nll), rel=1e-6)
    for name, grad in zip(("embed", "wq", "wk", "wv", "wo", "lm_head"), grads, strict=True):
        assert grad.dtype == np.float32
        np.testing.assert_allclose(grad, want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_storylm_step_compiled_matches_interpreter(storylm_step):
    import tilegen

    program, args = storylm_step
    lr = np.full((1, 1), 0.1, np.float32)
    expected = interpret(program, "storylm0_nll_step", *args, lr)
    module = tilegen.compile_file("storylm0_nll_step.kina", jit=True)
    got = module.storylm0_nll_step(*args, lr)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_storylm_gradient_ir_is_simplified(storylm_step):
    program, _ = storylm_step
    function = gradient_function(program, "storylm0_nll", (2, 3, 4, 5, 6, 7)).function
    ops = [op.op for op in function.body]
    assert ops.count("scatter_add") == 1  # the embedding's gradient: no one-hot matmul
    for op in function.body:
        if op.op in ("reshape", "broadcast"):
            assert op.operands[0].type != op.result.type, format_function(function)
        if op.op == "transpose":
            inner = next((o for o in function.body if op.operands[0] in o.results), None)
            assert inner is None or inner.op != "transpose"
        if op.op == "mul":
            assert not any(_is_fill(function, v, 1.0) for v in op.operands)
        if op.op == "sum":
            assert op.operands[0].type.shape[op.attr("axis")] != 1


def _is_fill(function, value, number) -> bool:
    for op in function.body:
        if value in op.results:
            return op.op == "fill" and op.attr("value") == number
    return False


# ---- the simplifier ---------------------------------------------------------------------

SIMPLIFY_CASES = {
    # pattern name: (input IR body, expected simplified body)
    "fold-noop-layout": (
        """%a = reshape(%x) {shape = [2, 3]} : f64[2, 3]
           %b = broadcast(%a) {shape = [2, 3]} : f64[2, 3]
           %c = transpose(%b) {perm = [0, 1]} : f64[2, 3]
           %r = exp(%c) : f64[2, 3]""",
        """%r = exp(%x) : f64[2, 3]"""),
    "fold-layout-chains": (
        """%a = transpose(%x) {perm = [1, 0]} : f64[3, 2]
           %b = transpose(%a) {perm = [1, 0]} : f64[2, 3]
           %c = reshape(%b) {shape = [6]} : f64[6]
           %d = reshape(%c) {shape = [3, 2]} : f64[3, 2]
           %e = transpose(%d) {perm = [1, 0]} : f64[2, 3]
           %f = transpose(%e) {perm = [1, 0]} : f64[3, 2]
           %g = reshape(%f) {shape = [2, 3]} : f64[2, 3]
           %r = add(%b, %g) : f64[2, 3]""",
        """%r = add(%x, %x) : f64[2, 3]"""),
    "fold-unit-sum": (
        """%a = broadcast(%x) {shape = [1, 2, 3]} : f64[1, 2, 3]
           %r = sum(%a) {axis = 0} : f64[2, 3]""",
        """%a = broadcast(%x) {shape = [1, 2, 3]} : f64[1, 2, 3]
           %r = reshape(%a) {shape = [2, 3]} : f64[2, 3]"""),
    "fold-fill-layout": (
        """%o = fill() {dtype = "f64", shape = [3], value = 2.0} : f64[3]
           %a = broadcast(%o) {shape = [2, 3]} : f64[2, 3]
           %b = neg(%a) : f64[2, 3]
           %r = mul(%x, %b) : f64[2, 3]""",
        """%b = fill() {dtype = "f64", shape = [2, 3], value = -2.0} : f64[2, 3]
           %r = mul(%x, %b) : f64[2, 3]"""),
    "fold-identities": (
        """%one = fill() {dtype = "f64", shape = [2, 3], value = 1.0} : f64[2, 3]
           %zero = fill() {dtype = "f64", shape = [2, 3], value = 0.0} : f64[2, 3]
           %a = mul(%one, %x) : f64[2, 3]
           %b = add(%a, %zero) : f64[2, 3]
           %c = div(%b, %one) : f64[2, 3]
           %d = sub(%zero, %c) : f64[2, 3]
           %e = neg(%d) : f64[2, 3]
           %f = sub(%e, %zero) : f64[2, 3]
           %r = exp(%f) : f64[2, 3]""",
        """%r = exp(%x) : f64[2, 3]"""),
}


def _ir(body: str) -> str:
    lines = "\n".join("  " + line.strip() for line in body.strip().splitlines())
    return f"func @f(%x: f64[2, 3]) -> (f64[2, 3]) {{\n{lines}\n  return %r\n}}\n"


def test_every_pattern_has_a_case():
    assert sorted(SIMPLIFY_CASES) == sorted(name for name, _ in PATTERNS)


@pytest.mark.parametrize("pattern", sorted(SIMPLIFY_CASES))
def test_simplify_pattern(pattern):
    before_text, after_text = SIMPLIFY_CASES[pattern]
    before = parse_ir(_ir(before_text))
    verify_program(before)
    simplified = simplify_function(before.function("f"))
    verify_function(None, simplified)
    expected = parse_ir(_ir(after_text)).function("f")
    assert format_function(simplified) == format_function(expected)
    x = np.random.default_rng(0).standard_normal((2, 3))
    (want,) = interpret(before, "f", x)
    (got,) = interpret(before.replace_function(simplified), "f", x)
    np.testing.assert_array_equal(got, want)


def test_cse_and_dce():
    program = parse_ir(_ir("""
        %a = exp(%x) : f64[2, 3]
        %b = exp(%x) : f64[2, 3]
        %dead = tanh(%x) : f64[2, 3]
        %z0 = fill() {dtype = "f64", shape = [2, 3], value = 0.0} : f64[2, 3]
        %z1 = fill() {dtype = "f64", shape = [2, 3], value = -0.0} : f64[2, 3]
        %c = mul(%a, %z0) : f64[2, 3]
        %d = mul(%b, %z1) : f64[2, 3]
        %e = add(%c, %d) : f64[2, 3]
        %r = add(%a, %e) : f64[2, 3]"""))
    simplified = simplify_function(program.function("f"))
    ops = [op.op for op in simplified.body]
    # one exp; no tanh; 0.0 and -0.0 stay apart; x * 0 is not folded (inf * 0 is nan).
    assert ops == ["exp", "fill", "fill", "mul", "mul", "add", "add"]
    x = np.array([[0.0, np.inf, -1.0], [2.0, -np.inf, 3.0]])
    (want,) = interpret(program, "f", x)
    (got,) = interpret(program.replace_function(simplified), "f", x)
    np.testing.assert_array_equal(got, want)


def test_simplify_keeps_a_main_without_return():
    program = program_from_text(f"""
        @main
        fn main() {{
          let x = placeholder({ktype((2,))});
          let y = reshape(x, [2]);
        }}
        """)
    assert simplify_function(program.main) == program.main


# ---- the verifier -----------------------------------------------------------------------

def _function(body: str):
    return parse_ir(_ir(body)).function("f")


def test_verifier_rejects_use_before_definition():
    function = _function("%y = exp(%x) : f64[2, 3]\n%r = exp(%y) : f64[2, 3]")
    swapped = dataclasses.replace(function, body=tuple(reversed(function.body)))
    with pytest.raises(IRVerifyError, match="%y is used before it is defined"):
        verify_function(None, swapped)


@pytest.mark.parametrize("body, message", [
    ("%r = exp(%x) : f64[3, 2]", "'exp' is typed f64[3, 2] but its rule gives f64[2, 3]"),
    ("%r = transpose(%x) {perm = [0, 0]} : f64[2, 3]", "is not a permutation"),
    ("%r = exp(%x) : f64[2, 3]\n%r = exp(%x) : f64[2, 3]", "%r is defined twice"),
    ("%r = frobnicate(%x) : f64[2, 3]", "unknown op 'frobnicate'"),
    ('%r = call(%x) {callee = "nowhere"} : f64[2, 3]', "'call' of unknown function 'nowhere'"),
    ("%r = matmul(%x, %x) : f64[2, 3]", "inner dims differ"),
])
def test_verifier_rejects(body, message):
    program = parse_ir(_ir("%r = exp(%x) : f64[2, 3]"))
    with pytest.raises(IRVerifyError, match=re.escape(message)):
        verify_function(program, _function(body))
