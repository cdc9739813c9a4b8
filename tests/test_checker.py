"""The checker: symbolic shape proofs, specialisation, canonical attributes, infix sugar,
annotations, calls, reverseMode typing and @main sink outputs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sympy

from kina_frontend import (
    KinaError,
    Source,
    check_source,
    format_program,
    load_program,
    parse_ir,
    specialize,
)
from kina_frontend.interpreter import main_outputs
from kina_frontend.report import types_report
from kina_frontend.types import DType, TensorType
from tests.markdown import fenced_blocks

REPO = Path(__file__).resolve().parents[1]


def check(text: str):
    return check_source(Source("t.kina", textwrap.dedent(text)))


def body_ops(checked, name="f"):
    return checked.program.function(name).body


T, H, Dh = (sympy.Symbol(n, integer=True, positive=True) for n in ("T", "H", "Dh"))


# ---- consts and proofs ----------------------------------------------------------------------

def test_consts_are_positive_integer_symbols_or_expressions() -> None:
    checked = check("""
        const T = 36;
        const H = 2;
        const Dh = 2;
        const D = H * Dh;
    """)
    assert checked.symbols["T"] == T
    assert checked.symbols["T"].is_integer and checked.symbols["T"].is_positive
    assert checked.symbols["D"] == H * Dh  # an expression, not a fresh symbol
    assert checked.constants == {"T": 36, "H": 2, "Dh": 2, "D": 4}


def test_rollout_reshape_is_proved_for_all_T() -> None:
    checked = load_program(REPO / "examples" / "storylm0_rollout.kina")
    reshapes = [o for o in checked.obligations if o.kind == "reshape-count"]
    assert {o.function for o in reshapes} == {"split_heads", "storylm0_rollout"}
    for obligation in reshapes:
        assert "36" not in obligation.claim and "T" in obligation.claim
        assert obligation.span is not None and obligation.span.source.name.endswith(".kina")
    # Independently of the recorded claim: the element counts agree as polynomials in T,
    # and so for every T, not only 36.
    for function in checked.program.functions:
        for op in function.body:
            if op.op == "reshape":
                (src,), (dst,) = op.operands, op.results
                assert sympy.expand(src.type.numel() - dst.type.numel()) == 0
                for t in (1, 2, 7, 36, 1000):
                    values = {T: t, H: 2, Dh: 2}
                    assert src.type.numel().subs(values) == dst.type.numel().subs(values)


def test_obligations_cover_every_kind_of_fact() -> None:
    checked = load_program(REPO / "examples" / "storylm0_nll_step.kina")
    kinds = {o.kind for o in checked.obligations}
    assert kinds >= {"reshape-count", "matmul-inner", "matmul-batch", "broadcast",
                     "permutation", "axis-range", "equal-shape", "type-equality"}
    by_function = {o.function for o in checked.obligations}
    assert by_function >= {"split_heads", "storylm0_forward", "storylm0_nll", "sgd_dd",
                           "storylm0_nll_step"}


def test_types_report_lists_the_obligations() -> None:
    checked = load_program(REPO / "examples" / "storylm0_rollout.kina")
    report = types_report(checked, "storylm0_rollout.kina")
    assert "const T = 36    // symbol: positive integer" in report
    assert "const D = Dh*H = 4" in report
    assert "[reshape-count] reshape: Dh*H*T elements == Dh*H*T" in report
    assert f"// {len(checked.obligations)} obligations discharged symbolically" in report


def test_specialize_gives_int_shapes_and_attrs() -> None:
    checked = load_program(REPO / "examples" / "storylm0_rollout.kina")
    program = specialize(checked)
    rollout = program.function("storylm0_rollout")
    assert rollout.result_types == (TensorType(DType.F32, (1, 36, 8)),)
    for function in program.functions:
        for op in function.body:
            for value in op.operands + op.results:
                assert all(type(d) is int for d in value.type.shape), (function.name, op)
            for key, attr in op.attrs:
                flat = attr if isinstance(attr, tuple) else (attr,)
                assert not any(isinstance(a, sympy.Basic) for a in flat), (op.op, key)
    split = program.function("split_heads").body
    assert split[0].op == "reshape" and split[0].attr("shape") == (1, 36, 2, 2)
    # The symbolic program is untouched.
    assert checked.program.function("split_heads").body[0].attr("shape") == (1, T, H, Dh)


# ---- canonical attributes -------------------------------------------------------------------

def test_reshape_infers_minus_one_symbolically() -> None:
    checked = check("""
        const T = 4;
        fn f(x: Tensor[F32, [1, T, 4], @host]) -> Tensor[F32, [1, 2 * T, 2], @host] {
          return reshape(x, [1, -1, 2]);
        }
    """)
    (op,) = body_ops(checked)
    assert op.attr("shape") == (1, 2 * T, 2)  # the -1 is resolved in the IR
    assert op.result.type.shape == (1, 2 * T, 2)
    claims = [o.claim for o in checked.obligations if o.kind == "reshape-infer"]
    assert claims == ["reshape: -1 = 2*T"]
    assert specialize(checked).function("f").body[0].attr("shape") == (1, 8, 2)


@pytest.mark.parametrize("call, axis", [
    ("sum(x, axis=-1)", 2), ("max(x, axis=-3)", 0), ("argmax(x, axis=-2)", 1),
    ("softmax(x, axis=-1)", 2), ("log_softmax(x, axis=-2)", 1), ("sum(x, axis=1)", 1),
])
def test_negative_axes_are_normalised(call: str, axis: int) -> None:
    checked = check(f"""
        fn f(x: Tensor[F32, [2, 3, 5], @host]) {{
          let y = {call};
        }}
    """)
    (op,) = body_ops(checked)
    assert op.attr("axis") == axis
    kept = call.startswith(("softmax", "log_softmax"))
    expected = (2, 3, 5) if kept else tuple(d for k, d in enumerate((2, 3, 5)) if k != axis)
    assert op.result.type.shape == expected


# ---- infix sugar ----------------------------------------------------------------------------

SUGAR = [
    ("a + b", "add(a, b)"),
    ("a - b", "sub(a, b)"),
    ("a * b", "mul(a, b)"),
    ("a / b", "div(a, b)"),
    ("a @ b", "matmul(a, b)"),
    ("-a", "neg(a)"),
    ("x * 0.5", "mul(x, 0.5)"),
    ("2.0 - x", "sub(2.0, x)"),
    ("a + b * c", "add(a, mul(b, c))"),
    ("a - b - c", "sub(sub(a, b), c)"),
    ("a / b / c", "div(div(a, b), c)"),
    ("(a + b) * c", "mul(add(a, b), c)"),
    ("-a * b", "mul(neg(a), b)"),
    ("- -a", "neg(neg(a))"),
    ("a @ b + c", "add(matmul(a, b), c)"),
    ("a * b @ c", "matmul(mul(a, b), c)"),
    ("a + b @ c * 2.0", "add(a, mul(matmul(b, c), 2.0))"),
    ("x * -1.0", "mul(x, -1.0)"),
]


def _sugar_program(expr: str) -> str:
    m = "Tensor[F32, [3, 3], @host]"
    return (f"fn f(a: {m}, b: {m}, c: {m}, x: {m}) -> {m} {{\n"
            f"  let y = {expr};\n  return y;\n}}\n")


@pytest.mark.parametrize("sugar, calls", SUGAR, ids=[s for s, _ in SUGAR])
def test_infix_sugar_builds_the_same_ir_as_calls(sugar: str, calls: str) -> None:
    lhs = check_source(Source("t.kina", _sugar_program(sugar))).program
    rhs = check_source(Source("t.kina", _sugar_program(calls))).program
    assert lhs == rhs
    assert format_program(lhs) == format_program(rhs)


def test_number_literal_becomes_a_fill_of_the_other_operand_type() -> None:
    checked = check("""
        const T = 3;
        fn f(i: Tensor[I64, [T, 2], @host]) {
          let j = 7 - i;
        }
    """)
    fill, sub = body_ops(checked)
    assert fill.op == "fill" and fill.operands == ()
    assert fill.attr_dict == {"dtype": "i64", "shape": (T, 2), "value": 7}
    assert sub.op == "sub" and sub.operands[0] == fill.result


# ---- annotations, calls, reverseMode --------------------------------------------------------

def test_let_annotation_is_checked_symbolically() -> None:
    checked = check("""
        const T = 3;
        fn f(x: Tensor[F32, [T, 2], @host]) {
          let y: Tensor[F32, [2 * T], @host] = reshape(x, [T + T]);
        }
    """)
    assert any(o.kind == "type-equality" and "'y' is annotated" in o.claim
               for o in checked.obligations)
    with pytest.raises(KinaError) as info:
        check("""
            const T = 3;
            fn f(x: Tensor[F32, [T, 2], @host]) {
              let y: Tensor[F32, [6], @host] = reshape(x, [T + T]);
            }
        """)
    assert info.value.kind == "shape" and "'y' is annotated" in info.value.message
    assert any("equal for the current values (6)" in n for n in info.value.notes)


def test_calls_are_call_ops_typed_by_the_callee_signature() -> None:
    checked = check("""
        const T = 3;
        fn pair(x: Tensor[F32, [T, 2], @host])
            -> (Tensor[F32, [2, T], @host], Tensor[F32, [T], @host]) {
          return (transpose(x, [1, 0]), sum(x, axis=1));
        }
        fn f(x: Tensor[F32, [T, 2], @host]) -> Tensor[F32, [T], @host] {
          let (a, b) = pair(x);
          return b;
        }
    """)
    (call,) = body_ops(checked)
    assert call.op == "call" and call.attr("callee") == "pair"
    assert [r.name for r in call.results] == ["a", "b"]
    assert [r.type for r in call.results] == list(checked.program.function("pair").result_types)
    assert checked.program.function("f").results == (call.results[1],)


REVERSE = """
    const T = 3;
    fn loss(ids: Tensor[I64, [T], @host], w: Tensor[F32, [T, 4], @host],
            b: Tensor[F32, [4], @host]) -> Tensor[F32, [], @host] {
      let h = w + broadcast(b, [T, 4]);
      return sum(sum(h * h, axis=1), axis=0);
    }
    fn f(ids: Tensor[I64, [T], @host], w: Tensor[F32, [T, 4], @host],
         b: Tensor[F32, [4], @host]) {
      let (y, g1, g2) = reverseMode(loss, wrt=%s)(ids, w, b);
    }
"""


@pytest.mark.parametrize("wrt, indices", [("[w, b]", (1, 2)), ("[b, w]", (2, 1)),
                                          ("[b]", (2,))])
def test_reverse_mode_results_are_f_result_then_wrt_param_types(wrt, indices) -> None:
    text = REVERSE % wrt
    if len(indices) == 1:
        text = text.replace("(y, g1, g2)", "(y, g1)")
    checked = check(text)
    (op,) = body_ops(checked)
    assert op.op == "reverse_mode"
    assert op.attr("callee") == "loss" and op.attr("wrt") == indices
    loss = checked.program.function("loss")
    expected = loss.result_types + tuple(loss.params[i].type for i in indices)
    assert tuple(r.type for r in op.results) == expected
    assert expected[0] == TensorType(DType.F32, ())


def test_reverse_mode_without_wrt_takes_every_float_param() -> None:
    checked = check(REVERSE.replace("loss, wrt=%s", "loss"))
    (op,) = body_ops(checked)
    assert op.attr("wrt") == (1, 2)  # ids is I64: not differentiable, left out


# ---- @main ----------------------------------------------------------------------------------

def test_main_placeholders_and_sink_outputs() -> None:
    program = specialize(load_program(REPO / "examples" / "storylm0_rollout.kina"))
    main = program.main
    assert main is not None and main.name == "main" and main.results == ()
    placeholders = [op for op in main.body if op.op == "placeholder"]
    assert [op.attr("index") for op in placeholders] == list(range(len(placeholders)))
    assert [v.name for v in main_outputs(main)] == ["logits", "greedy", "sampled"]
    types = [v.type for v in main_outputs(main)]
    assert types == [TensorType(DType.F32, (1, 36, 8)), TensorType(DType.I64, (1, 1)),
                     TensorType(DType.I64, (1, 1))]


def test_a_value_read_later_is_not_a_sink() -> None:
    program = specialize(check("""
        @main
        fn main() {
          let x = placeholder(Tensor[F32, [2], @host]);
          let y = exp(x);
          let z = y * 2.0;
          let unused = placeholder(Tensor[F32, [3], @host]);
        }
    """))
    assert [v.name for v in main_outputs(program.main)] == ["z"]


def test_only_one_main_and_it_is_marked() -> None:
    checked = load_program(REPO / "examples" / "storylm0_forward.kina")
    assert [f.name for f in checked.program.functions if f.is_main] == ["main"]
    assert checked.program.main.name == "main"


# ---- docs/kina.md: its examples are real --------------------------------------------------

KINA_MD = REPO / "docs" / "kina.md"


def _blocks(language: str) -> list[str]:
    return fenced_blocks(KINA_MD, language)


def test_every_kina_example_in_the_reference_compiles() -> None:
    blocks = _blocks("kina")
    assert len(blocks) >= 6
    for text in blocks:
        specialize(check_source(Source("doc.kina", text)))


def test_reference_main_example_has_the_documented_sink() -> None:
    (text,) = [b for b in _blocks("kina") if "@main" in b]
    program = specialize(check_source(Source("doc.kina", text)))
    assert [v.name for v in main_outputs(program.main)] == ["best"]


def test_reference_python_and_ir_examples_run(capsys) -> None:
    (code,) = _blocks("python")
    namespace: dict = {}
    exec(compile(code.replace('"examples/', f'"{REPO}/examples/'), "kina.md", "exec"),
         namespace)
    assert namespace["out"].tolist() == [3.0, 3.0]
    (ir,) = [b for b in _blocks("") if b.startswith("const T = 4\nfunc @f")]
    program = parse_ir(ir)
    assert format_program(program) == ir.replace("  // f.kina:3:10", "")


def test_reference_documents_every_registry_op() -> None:
    from kina_frontend.ops import REGISTRY

    rows = [line for line in KINA_MD.read_text().split("\n") if line.startswith("| `")]
    documented = {line.split("`")[1] for line in rows}
    missing = sorted(set(REGISTRY) - documented)
    assert not missing, f"ops missing from docs/kina.md: {missing}"
