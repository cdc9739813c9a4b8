"""Tensor IR: print -> parse_ir -> print round trips and a def-before-use verifier.

Covered: the three bundled examples (the checker's symbolic IR and the specialised IR,
with and without location comments) and hypothesis-generated programs whose shapes are
written over consts (`T`, `D = 2 * T`, `(T + 1) * 3`), so symbolic dims of every form the
printer emits -- products, sums, powers -- go through the parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_frontend import (
    Program,
    Source,
    check_source,
    format_program,
    load_program,
    parse_ir,
    specialize,
)
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import IRParseError

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("storylm0_forward", "storylm0_nll_step", "storylm0_rollout")
STRUCTURAL = {"call", "reverse_mode", "placeholder"}


# ---- the verifier ---------------------------------------------------------------------------

def verify(program: Program) -> None:
    """Every value is defined exactly once before it is used; ops and callees exist."""
    functions = {f.name: f for f in program.functions}
    assert len(functions) == len(program.functions), "function names must be unique"
    assert sum(f.is_main for f in program.functions) <= 1
    for function in program.functions:
        defined = {}
        for param in function.params:
            assert param.name not in defined, f"{function.name}: %{param.name} defined twice"
            defined[param.name] = param.type
        for index, op in enumerate(function.body):
            where = f"{function.name}, operation {index} ({op.op})"
            assert op.op in REGISTRY or op.op in STRUCTURAL, f"{where}: unknown op"
            for operand in op.operands:
                assert operand.name in defined, f"{where}: %{operand.name} used before defined"
                assert defined[operand.name] == operand.type, f"{where}: %{operand.name} type"
            for result in op.results:
                assert result.name not in defined, f"{where}: %{result.name} defined twice"
                defined[result.name] = result.type
            if op.op in ("call", "reverse_mode"):
                callee = functions.get(op.attr("callee"))
                assert callee is not None, f"{where}: unknown callee"
                assert len(op.operands) == len(callee.params), f"{where}: argument count"
                extra = tuple(callee.params[i].type for i in op.attr("wrt", ()))
                expected = callee.result_types + extra
                assert tuple(r.type for r in op.results) == expected, f"{where}: result types"
        for result in function.results:
            assert result.name in defined, f"{function.name}: returns undefined %{result.name}"


def is_concrete(program: Program) -> bool:
    values = [v for f in program.functions for v in f.params + f.results]
    values += [v for f in program.functions for op in f.body for v in op.operands + op.results]
    return all(isinstance(d, int) for v in values for d in v.type.shape)


def assert_round_trip(program: Program) -> None:
    text = format_program(program)
    parsed = parse_ir(text)
    assert format_program(parsed) == text
    assert parsed == program  # spans are not compared; everything else is
    # The location comments are not read back, and do not disturb the parse.
    assert parse_ir(format_program(program, with_locations=True)) == program
    verify(parsed)


# ---- the bundled examples -------------------------------------------------------------------

@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return load_program(REPO / "examples" / f"{request.param}.kina")


def test_example_symbolic_ir_round_trips(example) -> None:
    assert not is_concrete(example.program)  # shapes are over T, H, Dh, V
    assert_round_trip(example.program)


def test_example_specialised_ir_round_trips(example) -> None:
    program = specialize(example)
    assert is_concrete(program)
    assert_round_trip(program)


def test_example_ir_verifies(example) -> None:
    verify(example.program)
    verify(specialize(example))


def test_printed_ir_shape() -> None:
    checked = load_program(REPO / "examples" / "storylm0_forward.kina")
    text = format_program(checked.program, with_locations=True)
    assert text.startswith("const T = 4\nconst H = 2\nconst Dh = 2\nconst D = 4\nconst V = 8\n")
    assert "func @split_heads(%x: f32[1, T, Dh*H]) -> (f32[1, H, T, Dh]) {" in text
    assert "%t0 = reshape(%x) {shape = [1, T, H, Dh]} : f32[1, T, H, Dh]  // " in text
    assert "func @main() -> () attributes {main} {" in text
    assert "%ids = placeholder() {index = 0} : i64[1, T]" in text


# ---- generated programs ---------------------------------------------------------------------

class _Gen:
    """Builds a well-typed Kina function over symbolic dims, tracking each value's dims as
    Kina dimension text so result types can be written back exactly."""

    def __init__(self, draw):
        self.draw = draw
        self.lines: list[str] = []
        self.pool: list[tuple[str, str, tuple[str, ...]]] = []  # (name, dtype, dims)
        self.counter = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def bind(self, expr: str, dtype: str, dims) -> None:
        name = self.fresh()
        self.lines.append(f"  let {name} = {expr};")
        self.pool.append((name, dtype, tuple(dims)))

    def pick(self, dtype=None, min_rank=0, max_rank=9):
        candidates = [v for v in self.pool if (dtype is None or v[1] == dtype)
                      and min_rank <= len(v[2]) <= max_rank]
        return self.draw(st.sampled_from(candidates)) if candidates else None

    def step(self) -> None:
        kind = self.draw(st.sampled_from(
            ["unary", "binary", "literal", "transpose", "flatten", "infer", "broadcast",
             "reduce", "normalise", "matmul", "gather", "one_hot", "neg", "call"]))
        getattr(self, f"op_{kind}")()

    def op_unary(self) -> None:
        value = self.pick("F32")
        if value:
            op = self.draw(st.sampled_from(["exp", "tanh", "log", "sqrt"]))
            self.bind(f"{op}({value[0]})", "F32", value[2])

    def op_neg(self) -> None:
        value = self.pick()
        if value:
            self.bind(f"-{value[0]}", value[1], value[2])

    def op_binary(self) -> None:
        lhs = self.pick()
        if lhs:
            same = [v for v in self.pool if v[1:] == lhs[1:]]
            rhs = self.draw(st.sampled_from(same))
            ops = ["+", "-", "*", "/"] if lhs[1] == "F32" else ["+", "-", "*"]
            op = self.draw(st.sampled_from(ops))
            named = self.draw(st.booleans())
            call = {"+": "add", "-": "sub", "*": "mul", "/": "div"}[op]
            expr = f"{call}({lhs[0]}, {rhs[0]})" if named else f"{lhs[0]} {op} {rhs[0]}"
            self.bind(expr, lhs[1], lhs[2])

    def op_literal(self) -> None:
        value = self.pick()
        if value:
            number = self.draw(st.sampled_from(["0.5", "2.0", "1e-3", "3"])) \
                if value[1] == "F32" else self.draw(st.sampled_from(["2", "7"]))
            left = self.draw(st.booleans())
            op = self.draw(st.sampled_from(["+", "*", "-"]))
            expr = f"{number} {op} {value[0]}" if left else f"{value[0]} {op} {number}"
            self.bind(expr, value[1], value[2])

    def op_transpose(self) -> None:
        value = self.pick(min_rank=1)
        if value:
            perm = self.draw(st.permutations(range(len(value[2]))))
            dims = tuple(value[2][p] for p in perm)
            self.bind(f"transpose({value[0]}, [{', '.join(map(str, perm))}])", value[1], dims)

    def op_flatten(self) -> None:
        value = self.pick(min_rank=2)
        if value:
            *lead, a, b = value[2]
            dims = (*lead, f"({a}) * ({b})")
            self.bind(f"reshape({value[0]}, [{', '.join(dims)}])", value[1], dims)

    def op_infer(self) -> None:
        value = self.pick(min_rank=2)
        if value:
            *lead, a, b = value[2]
            written = (*lead, "-1")
            self.bind(f"reshape({value[0]}, [{', '.join(written)}])", value[1],
                      (*lead, f"({a}) * ({b})"))

    def op_broadcast(self) -> None:
        value = self.pick(max_rank=3)
        if value:
            extra = self.draw(st.sampled_from(["1", "2", "T", "T + 1"]))
            dims = (extra, *value[2])
            ones = [k for k, d in enumerate(value[2]) if d == "1"]
            if ones and self.draw(st.booleans()):  # also expand a size-1 dim
                k = self.draw(st.sampled_from(ones))
                dims = (extra, *value[2][:k], "D", *value[2][k + 1:])
            self.bind(f"broadcast({value[0]}, [{', '.join(dims)}])", value[1], dims)

    def op_reduce(self) -> None:
        value = self.pick(min_rank=1)
        if value:
            rank = len(value[2])
            axis = self.draw(st.integers(-rank, rank - 1))
            op = self.draw(st.sampled_from(["sum", "max", "argmax"]))
            dims = value[2][:axis % rank] + value[2][axis % rank + 1:]
            dtype = "I64" if op == "argmax" else value[1]
            self.bind(f"{op}({value[0]}, axis={axis})", dtype, dims)

    def op_normalise(self) -> None:
        value = self.pick("F32", min_rank=1)
        if value:
            axis = self.draw(st.integers(-len(value[2]), len(value[2]) - 1))
            op = self.draw(st.sampled_from(["softmax", "log_softmax"]))
            self.bind(f"{op}({value[0]}, axis={axis})", "F32", value[2])

    def op_matmul(self) -> None:
        value = self.pick("F32", min_rank=2, max_rank=4)
        if value:
            rank = len(value[2])
            swap = list(range(rank - 2)) + [rank - 1, rank - 2]
            dims = (*value[2][:-1], value[2][-2])
            self.bind(f"{value[0]} @ transpose({value[0]}, [{', '.join(map(str, swap))}])",
                      "F32", dims)

    def op_gather(self) -> None:
        self.bind("gather(table, ids)", "F32", ("1", "T", "D"))

    def op_one_hot(self) -> None:
        n = self.draw(st.sampled_from(["D", "3", "T * 2 - 1"]))
        self.bind(f"one_hot(ids, {n})", "F32", ("1", "T", n))

    def op_call(self) -> None:
        self.bind("helper(table)", "F32", ("D", "T + 1"))


def _type(dtype: str, dims) -> str:
    return f"Tensor[{dtype}, [{', '.join(dims)}], @host]"


@st.composite
def programs(draw) -> str:
    t_value = draw(st.integers(1, 5))
    gen = _Gen(draw)
    gen.pool = [("x", "F32", ("T", "D")), ("ids", "I64", ("1", "T")),
                ("table", "F32", ("T * 2", "D")), ("s", "F32", ("1",))]
    for _ in range(draw(st.integers(1, 10))):
        gen.step()
    returned = draw(st.lists(st.sampled_from(gen.pool), min_size=1, max_size=3, unique=True))
    results = ", ".join(_type(dtype, dims) for _, dtype, dims in returned)
    values = ", ".join(name for name, _, _ in returned)
    header = (f"fn generated(x: {_type('F32', ('T', 'D'))}, ids: {_type('I64', ('1', 'T'))},\n"
              f"             table: {_type('F32', ('T * 2', 'D'))}, s: {_type('F32', ('1',))})\n"
              f"    -> ({results}) {{\n")
    main = ""
    if draw(st.booleans()):
        main = ("\n@main\nfn main() {\n"
                f"  let x = placeholder({_type('F32', ('T', 'D'))});\n"
                f"  let ids = placeholder({_type('I64', ('1', 'T'))});\n"
                f"  let table = placeholder({_type('F32', ('T * 2', 'D'))});\n"
                f"  let s = placeholder({_type('F32', ('1',))});\n"
                f"  let ({', '.join(f'o{k}' for k in range(len(returned)))}) = "
                "generated(x, ids, table, s);\n"
                "  let (l, g) = reverseMode(loss, wrt=[w])(table);\n"
                "}\n")
    return (f"const T = {t_value};\nconst D = 2 * T;\n"
            f"fn helper(w: {_type('F32', ('T * 2', 'D'))}) -> {_type('F32', ('D', 'T + 1'))} {{\n"
            "  return transpose(broadcast(sum(transpose(w, [1, 0]), axis=1), [T + 1, D]), "
            "[1, 0]);\n}\n"
            f"fn loss(w: {_type('F32', ('T * 2', 'D'))}) -> {_type('F32', ())} {{\n"
            "  return sum(sum(w * w, axis=1), axis=0);\n}\n"
            + header + "\n".join(gen.lines) + ("\n" if gen.lines else "")
            + f"  return ({values});\n}}\n" + main)


@settings(max_examples=60, deadline=None)
@given(programs())
def test_generated_programs_round_trip(text: str) -> None:
    checked = check_source(Source("generated.kina", text))
    assert_round_trip(checked.program)
    program = specialize(checked)
    assert is_concrete(program)
    assert_round_trip(program)


# ---- malformed IR -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = exp(%z) : f32[2]\n  return %y\n}\n",
     "use of undefined value %z"),
    ("module {}\n", "expected 'const' or 'func'"),
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = exp(%x) {axis = [} : f32[2]\n  return %y\n}\n",
     "expected a dimension"),
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = exp(%x) : f32[2] ?\n}\n", "cannot read IR"),
])
def test_malformed_ir_raises_ir_parse_error(text: str, fragment: str) -> None:
    with pytest.raises(IRParseError, match=fragment.replace("[", r"\[")):
        parse_ir(text)


@pytest.mark.parametrize("text, line, column, fragment", [
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  %y = exp(%z) : f32[2]\n  return %y\n}\n",
     2, 12, "use of undefined value %z"),
    ("func @f(%x: f32[2]) -> (f32[2]) {\n  return %q\n}\n", 2, 10, "undefined value %q"),
    ("func @f(%x: f32[2]) -> (f32[3]) {\n  return %x\n}\n", 2, 3, "declares results"),
    ("func @f(%x: f16[2]) -> () {\n  return\n}\n", 1, 13, "expected an element type"),
    ("func @f(%x: f32[2]) -> () {\n  %a, %b = exp(%x) : f32[2]\n  return\n}\n", 2, 12,
     "binds 2 result(s) but gives 1 type(s)"),
    ("func @f(%x: f32[2]) -> () {\n  %x = exp(%x) : f32[2]\n  return\n}\n", 2, 3,
     "%x is defined twice"),
    ("func @f(%x: f32[2], %x: f32[2]) -> () {\n  return\n}\n", 1, 21, "declared twice"),
    ("const T = 4\nconst T = 5\n", 2, 7, "defined twice"),
    ("const T = x\n", 1, 11, "expected a positive integer"),
    ("func @f(%x: f32[2]) -> () {\n  %y = sum(%x) {axis = 1, axis = 0} : f32[]\n  return\n}\n",
     2, 27, "given twice"),
    ("func @f(%x: f32[" + "9" * 5000 + "]) -> () {\n  return\n}\n", 1, 17,
     "out of the I64 range"),
    ("func @f(%x: f32[T**99]) -> () {\n  return\n}\n", 1, 17, "expected a dimension"),
    ("const T = 2\nfunc @f(%x: f32[T**99]) -> () {\n  return\n}\n", 2, 19, "exponent"),
    ("func @f(%x: f32[2]) -> () {\n  %y = sum(%x) {axis = " + "[" * 500 + "} : f32[]\n}\n",
     2, 124, "nested more than 100 levels"),
    ("func @f(%x: f32[" + "(" * 3000 + "1]) -> () {\n  return\n}\n", 1, 117, "nested"),
    ("func @f(%x: f32[2]) -> () {\n  %y = exp(%x) : f32[2]\n", 3, 1, "the end of the IR"),
    ('func @f(%x: f32[2]) -> () {\n  %y = "exp"(%x) : f32[2]\n  return\n}\n', 2, 8,
     "expected an op name"),
])
def test_every_malformed_ir_text_is_a_kina_error_at_its_place(text, line, column,
                                                               fragment) -> None:
    from kina_frontend import KinaError

    with pytest.raises(KinaError) as info:
        parse_ir(text)
    error = info.value
    assert (error.code, error.line, error.column) == ("K750", line, column), str(error)
    assert fragment in error.message, str(error)
