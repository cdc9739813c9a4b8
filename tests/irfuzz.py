"""Generated tensor IR for fuzzing the public API (`parse_ir` + `tilegen.compile_program`).

Two hypothesis strategies of IR text:
- `mutated_ir()`: a valid program (the bundled examples, generated programs, one instance
  of every registry op) with one to three token or line edits;
- `soup_ir()`: a function of random ops over random operands, attributes and types; with
  `honest` result types (from the op's own rule) most of these are well typed.

`check_case(text)` is the property: the text either parses, verifies, compiles and
computes what the NumPy interpreter computes (an out-of-range id raising on both sides
counts as agreeing), or something along the way raises a `KinaError`. Anything else --
another exception, a wrong number -- fails the assertion; a crash kills the process, which
is why the campaign test also runs in a child process.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

import tilegen
from kina_frontend import KinaError, interpret, load_program, parse_ir, specialize
from kina_frontend.interpreter import InterpreterError
from kina_frontend.ops import REGISTRY
from kina_frontend.ops.indexing import IdOutOfRange
from kina_frontend.tensor_ir import Function, Operation, Program, Value, format_program, make_attrs
from kina_frontend.types import DType, TensorType
from kina_frontend.verify import ShapeRuleError, infer_types

ROOT = Path(__file__).resolve().parents[1]
SMALL_DIMS = (1, 2, 3, 5, 7)
ODD_NUMBERS = ("0", "1", "2", "3", "-1", "-2", "7", "17", "2147483648", "99999999999", "1.5",
               "-0.5", "nan", "inf")
WORDS = tuple(REGISTRY) + ("call", "reverse_mode", "placeholder", "f32", "f64", "i64", "bf16",
                           "const", "func", "return", "attributes", "main", "true", "axis",
                           "shape", "perm", "rows", "n", "callee", "wrt", "index", "dtype")
PUNCT = ("(", ")", "[", "]", "{", "}", ",", ":", "=", "->", "*", "+", "-")
_TOKENS = re.compile(r'//[^\n]*|%[A-Za-z0-9_.]+|@\w+|"[^"\n]*"|-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?'
                     r"|[A-Za-z_]\w*|->|\S")


# ---- seeds ----------------------------------------------------------------------------------

def _op_case_texts() -> list[str]:
    from tests.test_api_verify import OP_CASES, _ir

    return [_ir(name, case[2]) for name, case in sorted(OP_CASES.items())]


@functools.cache
def seed_texts() -> tuple[str, ...]:
    from kina_frontend import program_from_text
    from tests.progen import generate_program

    texts = [format_program(specialize(load_program(ROOT / "examples" / name)))
             for name in ("storylm0_forward.kina", "storylm0_nll_step.kina")
             if (ROOT / "examples" / name).exists()]
    for seed in range(12):
        generated = generate_program(np.random.default_rng(seed))
        texts.append(format_program(program_from_text(generated.source)))
    texts += _op_case_texts()
    return tuple(texts)


# ---- mutations ------------------------------------------------------------------------------

def _mutate(draw, text: str) -> str:
    tokens = [t for t in _TOKENS.findall(text) if not t.startswith("//")]
    kind = draw(st.sampled_from(("number", "word", "delete", "duplicate", "swap-values",
                                 "punct", "line-delete", "line-duplicate", "line-swap")))
    if kind.startswith("line"):
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if kind == "line-delete":
            del lines[i]
        elif kind == "line-duplicate":
            lines.insert(i, lines[j])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    i = draw(st.integers(0, len(tokens) - 1))
    if kind == "number":
        numbers = [k for k, t in enumerate(tokens) if re.fullmatch(r"-?\d.*", t)]
        if numbers:
            i = numbers[draw(st.integers(0, len(numbers) - 1))]
        tokens[i] = draw(st.sampled_from(ODD_NUMBERS))
    elif kind == "word":
        words = [k for k, t in enumerate(tokens) if re.fullmatch(r"[A-Za-z_]\w*", t)]
        if words:
            i = words[draw(st.integers(0, len(words) - 1))]
        tokens[i] = draw(st.sampled_from(WORDS))
    elif kind == "delete":
        del tokens[i]
    elif kind == "duplicate":
        tokens.insert(i, tokens[i])
    elif kind == "swap-values":
        values = [k for k, t in enumerate(tokens) if t.startswith("%")]
        if len(values) >= 2:
            a = values[draw(st.integers(0, len(values) - 1))]
            b = values[draw(st.integers(0, len(values) - 1))]
            tokens[a], tokens[b] = tokens[b], tokens[a]
    else:
        tokens.insert(i, draw(st.sampled_from(PUNCT)))
    return _join(tokens)


def _join(tokens: list[str]) -> str:
    """Tokens back to text: newlines before `%x =`, `return`, `func` and `}` keep the IR's
    shape readable; everything else is separated by a space (the IR ignores spacing)."""
    out = []
    for position, token in enumerate(tokens):
        following = tokens[position + 1] if position + 1 < len(tokens) else ""
        starts_line = token in ("return", "func", "}") or (
            token.startswith("%") and following in ("=", ","))
        out.append(("\n" if starts_line else " ") + token)
    return "".join(out) + "\n"


@st.composite
def mutated_ir(draw) -> str:
    text = draw(st.sampled_from(seed_texts()))
    for _ in range(draw(st.integers(1, 3))):
        text = _mutate(draw, text)
    return text


# ---- op soup --------------------------------------------------------------------------------

_types = st.builds(lambda dtype, shape: TensorType(dtype, tuple(shape)),
                   st.sampled_from((DType.F32,) * 4 + (DType.I64, DType.F64)),
                   st.lists(st.sampled_from(SMALL_DIMS), min_size=0, max_size=3))


def _attr_value(draw, kind: str, operands: list[Value]):
    """Mostly a value of the parameter's kind drawn near the operands' shapes, sometimes
    anything (a wrong kind the verifier must refuse)."""
    if draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from((1.5, "x", (), (1, "a"), -3, 10**12)))
    shape = list(operands[0].type.shape) if operands else [3]
    if kind == "dims":
        choice = draw(st.integers(0, 3))
        if choice == 0 and shape:
            return tuple(draw(st.permutations(shape)))
        if choice == 1:
            return (draw(st.sampled_from(SMALL_DIMS)), *shape)
        return tuple(draw(st.lists(st.sampled_from(SMALL_DIMS + (-1,)), max_size=3)))
    if kind == "ints":
        return tuple(draw(st.permutations(list(range(len(shape))))))
    if kind == "dim":
        return draw(st.sampled_from(SMALL_DIMS))
    if kind == "axis":
        return draw(st.integers(-len(shape) - 1, len(shape)))
    if kind == "number":
        return draw(st.sampled_from((0.5, 2.0, -1.0, 3)))
    return draw(st.sampled_from(("f32", "f64", "i64")))


@st.composite
def soup_program(draw) -> Program:
    params = [Value(f"a{i}", draw(_types)) for i in range(draw(st.integers(1, 3)))]
    pool = list(params)
    body = []
    for position in range(draw(st.integers(1, 4))):
        opname = draw(st.sampled_from(sorted(REGISTRY)))
        definition = REGISTRY[opname]
        arity = len(definition.operand_params) + draw(st.sampled_from((0,) * 18 + (1, -1)))
        operands = [draw(st.sampled_from(pool)) for _ in range(max(0, arity))]
        attrs = {p.name: _attr_value(draw, p.kind, operands) for p in definition.attr_params}
        try:
            honest = infer_types(opname, [v.type for v in operands], dict(attrs))
        except (ShapeRuleError, TypeError, ValueError, IndexError, KeyError):
            honest = None
        if honest is not None and draw(st.integers(0, 4)) > 0:
            types = honest
        else:
            types = (draw(_types),)
        results = tuple(Value(f"v{position}_{k}", t) for k, t in enumerate(types))
        body.append(Operation(opname, tuple(operands), results, make_attrs(**attrs)))
        pool.extend(results)
    returned = tuple(draw(st.lists(st.sampled_from(pool[len(params):] or pool), min_size=1,
                                   max_size=2, unique_by=lambda v: v.name)))
    return Program((), (Function("f", tuple(params), tuple(body), returned),))


@st.composite
def soup_ir(draw) -> str:
    """A soup program as text (so that printing and parsing are fuzzed with it)."""
    try:
        return format_program(draw(soup_program()))
    except (TypeError, ValueError):  # an attribute value the printer has no form for
        return "func @f() -> () {\n  return\n}\n"


@st.composite
def rewritten_ir(draw) -> str:
    """A valid program with one operation changed where the printer cannot see a problem:
    its result type, its op (another of the same arity), an attribute, or its operands.
    Such text parses; the verifier has to find what is wrong (or that nothing is)."""
    program = parse_ir(draw(st.sampled_from(seed_texts())))
    function = draw(st.sampled_from(program.functions))
    if not function.body:
        return format_program(program)
    position = draw(st.integers(0, len(function.body) - 1))
    op = function.body[position]
    change = draw(st.sampled_from(("type", "op", "attr", "operands")))
    if change == "type":
        results = tuple(Value(r.name, draw(_types)) for r in op.results)
        op = Operation(op.op, op.operands, results, op.attrs, op.span)
    elif change == "op":
        same = sorted(n for n, d in REGISTRY.items()
                      if len(d.operand_params) == len(op.operands)) or [op.op]
        op = Operation(draw(st.sampled_from(same)), op.operands, op.results, op.attrs, op.span)
    elif change == "attr" and op.attrs:
        name, _ = draw(st.sampled_from(op.attrs))
        definition = REGISTRY.get(op.op)
        kind = next((p.kind for p in definition.attr_params if p.name == name), "dim") \
            if definition else "dim"
        value = _attr_value(draw, kind, list(op.operands))
        op = Operation(op.op, op.operands, op.results,
                       make_attrs(**{**op.attr_dict, name: value}), op.span)
    elif op.operands:
        defined = list(function.params) + [r for o in function.body[:position] for r in o.results]
        operands = tuple(draw(st.sampled_from(defined)) for _ in op.operands)
        op = Operation(op.op, operands, op.results, op.attrs, op.span)
    body = function.body[:position] + (op,) + function.body[position + 1:]
    changed = Function(function.name, function.params, body, function.results,
                       function.is_main, function.span)
    try:
        return format_program(program.replace_function(changed))
    except (TypeError, ValueError):  # an attribute value the printer has no form for
        return format_program(program)


ir_texts = st.one_of(mutated_ir(), soup_ir(), rewritten_ir())


# ---- the property ---------------------------------------------------------------------------

def _inputs(types: list[TensorType], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    values = []
    for ttype in types:
        shape = ttype.concrete_shape
        if ttype.dtype.is_float:
            values.append(rng.uniform(0.25, 0.75, shape).astype(ttype.dtype.numpy))
        else:  # ids below every table/class count, or BOOL masks
            values.append(rng.integers(0, 2, shape).astype(ttype.dtype.numpy))
    return values


# Verified programs with a tensor larger than this are compiled but not run.
MAX_RUN_ELEMENTS = 1 << 22


def _largest_tensor(program: Program) -> int:
    types = [v.type for f in program.functions for v in f.params] + [
        r.type for f in program.functions for op in f.body for r in op.results]
    return max((int(np.prod(t.concrete_shape, dtype=np.int64)) for t in types), default=0)


def _live_ids_in_range(program: Program, name: str, inputs: list[np.ndarray]) -> bool:
    from kina_frontend.transforms import prepare_for_codegen

    live = prepare_for_codegen(program, name)  # calls inlined, dead operations dropped
    try:
        interpret(Program(program.constants, (live,)), name, *inputs)
    except IdOutOfRange:
        return False
    return True


def check_case(text: str) -> str:
    """Run one IR text through the API; return how it ended ('parse', 'verify', 'lowering',
    'ran', 'ids'), or fail an assertion on any other outcome."""
    try:
        program = parse_ir(text)
    except KinaError as error:
        assert error.line is not None, f"parse error without a location: {error}"
        return "parse"
    try:
        module = tilegen.compile_program(program)
    except KinaError:
        return "verify"
    if _largest_tensor(program) > MAX_RUN_ELEMENTS:
        return "too big to run"  # verified and compiled; running it could exhaust memory
    outcome = "ran"
    for function in program.functions:
        if function.is_main:
            types = [op.result.type for op in function.body if op.op == "placeholder"]
        else:
            types = list(function.param_types)
        inputs = _inputs(types, len(text))
        try:
            compiled = getattr(module, function.name)
        except KinaError:
            outcome = "lowering"
            continue
        try:
            if function.is_main:
                expected = interpret(program, function.name, placeholders=inputs)
            else:
                expected = interpret(program, function.name, *inputs)
        except IdOutOfRange:
            expected = None
        except InterpreterError as error:  # pragma: no cover - would be a verifier gap
            raise AssertionError(f"verified IR the interpreter rejects: {error}") from error
        try:
            got = compiled(*inputs)
        except tilegen.IdOutOfRangeError:
            assert expected is None, "compiled code raised an id error the interpreter did not"
            outcome = "ids"
            continue
        if expected is None:
            # Compiled code drops operations whose results nothing uses, ids and all; the
            # interpreter runs them. Agreeing means: the live operations raise nothing.
            assert _live_ids_in_range(program, function.name, inputs), \
                "the interpreter raised an id error compiled code did not"
            continue
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype,
                                                              e.shape)
            finite = np.abs(e[np.isfinite(e)]) if e.dtype.kind == "f" else np.abs(e)
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            # Looser than the differential tests: mutants of the training step subtract
            # large gradients (cancellation), and the point here is garbage, not ulps.
            np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4 * scale, equal_nan=True)
    return outcome
