"""Tensor IR through the public API is verified before it is lowered (issue 17, item 7).

`tilegen.compile_program` takes any `Program`, typically from `kina_frontend.parse_ir`. IR
whose declared types lie about what an op computes must be a `KinaError` naming the op at
its place in the IR text -- never a run that reads garbage, never a signal.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError, Operation, interpret, parse_ir
from kina_frontend.ops import REGISTRY

ROOT = Path(__file__).resolve().parents[1]

# One well-typed instance of every registry op: (operand types, attributes, result type).
# Attributes are written as the IR prints them.
OP_CASES = {
    "add": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "sub": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "mul": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "div": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "neg": (["f32[3, 5]"], "", "f32[3, 5]"),
    "exp": (["f32[3, 5]"], "", "f32[3, 5]"),
    "log": (["f32[3, 5]"], "", "f32[3, 5]"),
    "sqrt": (["f32[3, 5]"], "", "f32[3, 5]"),
    "tanh": (["f32[3, 5]"], "", "f32[3, 5]"),
    "fill": ([], '{dtype = "f32", shape = [3, 5], value = 1.5}', "f32[3, 5]"),
    "cast": (["i64[3, 5]"], '{dtype = "f32"}', "f32[3, 5]"),
    "gather": (["f32[7, 3]", "i64[2, 5]"], "", "f32[2, 5, 3]"),
    "scatter_add": (["f32[2, 5, 3]", "i64[2, 5]"], "{rows = 7}", "f32[7, 3]"),
    "one_hot": (["i64[2, 5]"], "{n = 7}", "f32[2, 5, 7]"),
    "broadcast": (["f32[3, 1]"], "{shape = [2, 3, 5]}", "f32[2, 3, 5]"),
    "reshape": (["f32[3, 10]"], "{shape = [5, 6]}", "f32[5, 6]"),
    "transpose": (["f32[2, 3, 5]"], "{perm = [2, 0, 1]}", "f32[5, 2, 3]"),
    "matmul": (["f32[2, 3, 5]", "f32[2, 5, 7]"], "", "f32[2, 3, 7]"),
    "sum": (["f32[3, 5]"], "{axis = 1}", "f32[3]"),
    "max": (["f32[3, 5]"], "{axis = 0}", "f32[5]"),
    "argmax": (["f32[3, 5]"], "{axis = 1}", "i64[3]"),
    "softmax": (["f32[3, 5]"], "{axis = 1}", "f32[3, 5]"),
    "log_softmax": (["f32[3, 5]"], "{axis = 0}", "f32[3, 5]"),
    "abs": (["f32[3, 5]"], "", "f32[3, 5]"),
    "erf": (["f32[3, 5]"], "", "f32[3, 5]"),
    "gelu": (["f32[3, 5]"], "", "f32[3, 5]"),
    "gelu_tanh": (["f32[3, 5]"], "", "f32[3, 5]"),
    "relu": (["f32[3, 5]"], "", "f32[3, 5]"),
    "rsqrt": (["f32[3, 5]"], "", "f32[3, 5]"),
    "sigmoid": (["f32[3, 5]"], "", "f32[3, 5]"),
    "silu": (["f32[3, 5]"], "", "f32[3, 5]"),
    "pow": (["f32[3, 5]"], "{p = 2.5}", "f32[3, 5]"),
    "maximum": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "minimum": (["f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "equal": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "greater": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "greater_equal": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "less": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "less_equal": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "not_equal": (["f32[3, 5]", "f32[3, 5]"], "", "bool[3, 5]"),
    "where": (["bool[3, 5]", "f32[3, 5]", "f32[3, 5]"], "", "f32[3, 5]"),
    "mean": (["f32[3, 5]"], "{axis = 1}", "f32[3]"),
    "min": (["f32[3, 5]"], "{axis = 0}", "f32[5]"),
    "layer_norm": (["f32[3, 5]", "f32[5]", "f32[5]"], "{axis = 1, eps = 1e-05}", "f32[3, 5]"),
    "rms_norm": (["f32[3, 5]", "f32[5]"], "{axis = 1, eps = 1e-06}", "f32[3, 5]"),
    "concat": (["f32[3, 5]", "f32[3, 2]"], "{axis = 1}", "f32[3, 7]"),
    "slice": (["f32[3, 5]"], "{axis = 1, size = 2, start = 3}", "f32[3, 2]"),
    "iota": ([], "{axis = 1, shape = [3, 5]}", "i64[3, 5]"),
}


def _ir(opname: str, result: str) -> str:
    operands, attrs, _ = OP_CASES[opname]
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(operands))
    args = ", ".join(f"%a{i}" for i in range(len(operands)))
    attrs = f" {attrs}" if attrs else ""
    return (f"func @f({params}) -> ({result}) {{\n"
            f"  %r = {opname}({args}){attrs} : {result}\n"
            f"  return %r\n}}\n")


def _lies(result: str) -> list[str]:
    """Result types that are not what the op computes: a wrong dim, an extra dim, a
    dropped dim, the other element type."""
    dtype, dims_text = result[:-1].split("[")
    dims = [int(d) for d in dims_text.split(", ") if d]
    other = "i64" if dtype == "f32" else "f32"
    lies = [f"{dtype}[{', '.join(str(d) for d in [dims[0] + 1] + dims[1:])}]",
            f"{dtype}[{', '.join(str(d) for d in dims + [2])}]",
            f"{other}[{', '.join(str(d) for d in dims)}]"]
    if len(dims) > 1:
        lies.append(f"{dtype}[{', '.join(str(d) for d in dims[1:])}]")
    return lies


def _inputs(program, rng) -> list[np.ndarray]:
    values = []
    for param in program.functions[0].params:
        shape = param.type.concrete_shape
        if param.type.dtype.is_float:
            values.append(rng.uniform(0.5, 2.0, shape).astype(np.float32))
        elif param.type.dtype.numpy == np.bool_:
            values.append(rng.integers(0, 2, shape).astype(np.bool_))
        else:
            values.append(rng.integers(0, 5, shape))  # below every table/class count above
    return values


def test_every_registry_op_has_a_case() -> None:
    assert sorted(OP_CASES) == sorted(REGISTRY)


@pytest.mark.parametrize("opname", sorted(OP_CASES))
def test_well_typed_op_compiles_and_matches_the_interpreter(opname: str) -> None:
    program = parse_ir(_ir(opname, OP_CASES[opname][2]))
    inputs = _inputs(program, np.random.default_rng(3))
    (expected,) = interpret(program, "f", *inputs)
    got = tilegen.compile_program(program).f(*inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opname", sorted(OP_CASES))
def test_lying_result_type_is_a_kina_error_at_the_op(opname: str) -> None:
    for lie in _lies(OP_CASES[opname][2]):
        program = parse_ir(_ir(opname, lie))
        with pytest.raises(KinaError) as info:
            tilegen.compile_program(program)
        error = info.value
        assert error.code == "K750", (lie, str(error))
        assert (error.line, error.column) == (2, 8), (lie, str(error))
        assert f"'{opname}'" in error.message or f"{opname}:" in error.message, str(error)


# The programs of the issue, each ill-typed in a different way; before the fix the first
# four ran (reading garbage) and the gather segfaulted.
ISSUE_PROGRAMS = {
    "matmul of f32[2,3] by f32[4,5]": (
        "func @f(%a: f32[2, 3], %b: f32[4, 5]) -> (f32[2, 5]) {\n"
        "  %c = matmul(%a, %b) : f32[2, 5]\n  return %c\n}\n", "inner dims differ"),
    "add of mismatched shapes": (
        "func @f(%a: f32[2, 3], %b: f32[4, 5]) -> (f32[2, 3]) {\n"
        "  %c = add(%a, %b) : f32[2, 3]\n  return %c\n}\n", "operand shapes differ"),
    "reshape that lies": (
        "func @f(%a: f32[2, 3]) -> (f32[4, 5]) {\n"
        "  %c = reshape(%a) {shape = [4, 5]} : f32[4, 5]\n  return %c\n}\n",
        "element count"),
    "broadcast that lies": (
        "func @f(%a: f32[3]) -> (f32[4, 5]) {\n"
        "  %c = broadcast(%a) {shape = [4, 3]} : f32[4, 5]\n  return %c\n}\n",
        "'broadcast' is typed f32[4, 5] but its rule gives f32[4, 3]"),
    "gather f32[400, 3]": (
        "func @f(%t: f32[8, 3], %i: i64[2]) -> (f32[400, 3]) {\n"
        "  %c = gather(%t, %i) : f32[400, 3]\n  return %c\n}\n",
        "'gather' is typed f32[400, 3] but its rule gives f32[2, 3]"),
}


@pytest.mark.parametrize("name", sorted(ISSUE_PROGRAMS))
def test_issue_programs_are_diagnosed_in_a_child_process(name: str) -> None:
    text, fragment = ISSUE_PROGRAMS[name]
    script = textwrap.dedent(f"""
        import numpy as np, tilegen
        from kina_frontend import KinaError, parse_ir
        program = parse_ir({text!r})
        try:
            module = tilegen.compile_program(program)
        except KinaError as error:
            print(error)
            raise SystemExit(3)
        f = module.f
        args = [np.ones(p.type.concrete_shape, p.type.dtype.numpy)
                for p in program.functions[0].params]
        f(*args)
        print("RAN")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=120, check=False)
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
    assert result.stdout.startswith("<ir>:2:8: error[K750]: @f: "), result.stdout
    assert fragment in result.stdout


@pytest.mark.parametrize("text, fragment", [
    # A call's callee must exist, must not be the @main, and calls must not recurse.
    ('func @f(%x: f32[2]) -> (f32[2]) {\n  %y = call(%x) {callee = "f"} : f32[2]\n'
     '  return %y\n}\n', "recursive"),
    ('func @m() -> (f32[2]) attributes {main} {\n  %p = placeholder() {index = 0} : f32[2]\n'
     '  return %p\n}\n'
     'func @f(%x: f32[2]) -> (f32[2]) {\n  %y = call() {callee = "m"} : f32[2]\n'
     '  return %y\n}\n', "of the @main function"),
    # Types must be concrete and positive, placeholders numbered in order.
    ("const T = 4\nfunc @f(%x: f32[T]) -> (f32[T]) {\n  %y = exp(%x) : f32[T]\n"
     "  return %y\n}\n", "symbolic type"),
    ("func @f(%x: f32[0]) -> (f32[0]) {\n  %y = exp(%x) : f32[0]\n  return %y\n}\n",
     "dims must lie in"),
    ("func @f(%x: f32[65536, 65536, 65536]) -> (f32[65536, 65536, 65536]) {\n"
     "  return %x\n}\n", "more than the limit"),
    ("func @m() -> () attributes {main} {\n  %p = placeholder() {index = 3} : f32[2]\n"
     "  %q = exp(%p) : f32[2]\n  return\n}\n", "placeholder 0 has index 3"),
    # Attributes are checked against the op's parameter kinds, and none may be extra.
    ('func @f(%x: f32[2, 3]) -> (f32[2]) {\n  %y = sum(%x) {axis = "one"} : f32[2]\n'
     "  return %y\n}\n", "attribute axis must be an integer"),
    ("func @f(%x: f32[2, 3]) -> (f32[2]) {\n  %y = sum(%x) {axis = 1, keep = 1} : f32[2]\n"
     "  return %y\n}\n", "unknown attribute(s) keep"),
    ("func @f(%x: f32[2, 3]) -> (f32[2]) {\n  %y = sum(%x) : f32[2]\n  return %y\n}\n",
     "missing attribute(s) axis"),
    ("func @f(%x: f32[2, 3]) -> (f32[3, 2]) {\n"
     "  %y = transpose(%x) {perm = [1, 99]} : f32[3, 2]\n  return %y\n}\n", "transpose"),
    ('func @f(%x: f32[2, 3]) -> (f32[2, 3]) {\n  %y = cast(%x) {dtype = "f16"} : f32[2, 3]\n'
     "  return %y\n}\n", "attribute dtype must be an element type name"),
])
def test_structurally_bad_ir_is_a_kina_error(text: str, fragment: str) -> None:
    with pytest.raises(KinaError) as info:
        tilegen.compile_program(parse_ir(text))
    assert info.value.code == "K750"
    assert fragment in str(info.value)


def test_compile_file_output_still_passes_the_verifier() -> None:
    """Every bundled example, specialised, is what compile_program accepts."""
    from kina_frontend import load_program, specialize
    from kina_frontend.verify import check_program

    for path in sorted((ROOT / "examples").glob("*.kina")):
        check_program(specialize(load_program(path)))


CALLEE = ("func @g(%x: f32[3, 5]) -> (f32[]) {\n  %s = sum(%x) {axis = 1} : f32[3]\n"
          "  %t = sum(%s) {axis = 0} : f32[]\n  return %t\n}\n")


@pytest.mark.parametrize("op, result", [
    ('call(%a) {callee = "g"}', "f32[3]"),
    ('call(%a) {callee = "g"}', "i64[]"),
    ('reverse_mode(%a) {callee = "g", wrt = [0]}', "f32[], f32[5, 3]"),
    ('reverse_mode(%a) {callee = "g", wrt = [0]}', "f32[]"),
])
def test_lying_structural_ops_are_kina_errors(op: str, result: str) -> None:
    names = ", ".join(f"%r{i}" for i in range(result.count("[")))
    text = CALLEE + (f"func @f(%a: f32[3, 5]) -> ({result}) {{\n  {names} = {op} : {result}\n"
                     f"  return {names}\n}}\n")
    with pytest.raises(KinaError) as info:
        tilegen.compile_program(parse_ir(text))
    assert info.value.code == "K750" and info.value.line == 7, str(info.value)
    assert f"'{op.split('(')[0]}'" in info.value.message, str(info.value)


def test_honest_reverse_mode_through_the_api_matches_the_interpreter() -> None:
    text = CALLEE + ("func @f(%a: f32[3, 5]) -> (f32[], f32[3, 5]) {\n"
                     '  %l, %g = reverse_mode(%a) {callee = "g", wrt = [0]} : f32[], f32[3, 5]\n'
                     "  return %l, %g\n}\n")
    program = parse_ir(text)
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    loss, grad = tilegen.compile_program(program).f(a)
    np.testing.assert_allclose(loss, a.sum(), rtol=1e-5)
    np.testing.assert_array_equal(grad, np.ones((3, 5), np.float32))


def test_hand_built_program_without_spans_gets_the_context_as_a_note() -> None:
    """A Program built in Python has no spans: the error shows the operations around the
    failing one instead, and an attribute given twice is refused."""
    import dataclasses

    program = parse_ir(_ir("sum", "f32[3]"))
    function = program.functions[0]
    (op,) = function.body
    for attrs in ((("axis", 1), ("axis", 0)), (("axis", 0),)):
        bad = dataclasses.replace(function, body=(Operation(op.op, op.operands, op.results,
                                                            attrs),))
        with pytest.raises(KinaError) as info:
            tilegen.compile_program(program.replace_function(bad))
        assert info.value.span is None and info.value.code == "K750"
        assert ">> %r = sum(%a0) {axis = " in str(info.value)
