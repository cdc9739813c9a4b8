"""NumPy reference interpreter for the concrete tensor IR: the oracle of every test.

It runs each operation through its op's `reference` rule (written from the op's
semantics in ops/, independent of any code generator). Calls run the callee;
`reverse_mode` runs the autodiff transform's output for the callee.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .autodiff import gradient_function
from .ops import REGISTRY
from .ops.indexing import IdOutOfRange
from .tensor_ir import Function, Operation, Program, Value, main_outputs


class InterpreterError(ValueError):
    pass


def interpret(program: Program, name: str, *args: np.ndarray,
              placeholders: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, ...]:
    """Run function `name` on `args`; returns its results as a tuple of arrays.

    For an @main function, `placeholders` supplies each `placeholder(...)` in order and
    the result is the tuple of its sink values (see `main_outputs`).
    """
    function = program.function(name)
    env = _bind_params(function, args)
    outputs = function.results if function.results or not function.is_main else \
        main_outputs(function)
    _run_body(program, function, env, list(placeholders), _live(function, outputs))
    return tuple(env[v.name] for v in outputs)


def _live(function: Function, outputs: Sequence[Value]) -> set[int]:
    """Indices of the operations the outputs need. A value nothing reads is not computed,
    as in compiled code, so a dead `gather` checks no ids there either; placeholders
    always run (each takes the next supplied array)."""
    needed = {v.name for v in outputs}
    live = set()
    for index in reversed(range(len(function.body))):
        op = function.body[index]
        if op.op == "placeholder" or any(r.name in needed for r in op.results):
            live.add(index)
            needed.update(v.name for v in op.operands)
    return live



def _bind_params(function: Function, args: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    if len(args) != len(function.params):
        raise InterpreterError(f"{function.name}: expected {len(function.params)} argument(s), "
                               f"got {len(args)}")
    env = {}
    for param, arg in zip(function.params, args, strict=True):
        array = np.asarray(arg)
        expected = param.type
        if array.dtype != expected.dtype.numpy or array.shape != expected.concrete_shape:
            raise InterpreterError(
                f"{function.name}: argument '{param.name}' must be {expected}, got "
                f"{array.dtype}{list(array.shape)}")
        env[param.name] = array
    return env


def _run_body(program: Program, function: Function, env: dict[str, np.ndarray],
              placeholders: list[np.ndarray], live: set[int] | None = None) -> None:
    for index, op in enumerate(function.body):
        if live is not None and index not in live:
            continue
        try:
            outputs = _run_operation(program, op, [env[v.name] for v in op.operands],
                                     placeholders)
        except IdOutOfRange as error:
            # Say where in the Kina source the bad id met the op (innermost call site only).
            if op.span is not None and not getattr(error, "located", False):
                error.args = (f"{op.span}: {error.args[0]}",)
                error.located = True
            raise
        for value, array in zip(op.results, outputs, strict=True):
            expected = value.type
            if array.shape != expected.concrete_shape or array.dtype != expected.dtype.numpy:
                raise InterpreterError(f"{op.op} produced {array.dtype}{list(array.shape)}, "
                                       f"typed {expected}")
            env[value.name] = array


def _run_operation(program: Program, op: Operation, args: list[np.ndarray],
                   placeholders: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    if op.op == "placeholder":
        index = op.attr("index")
        if index >= len(placeholders):
            raise InterpreterError(f"no value supplied for placeholder {index}")
        return (np.asarray(placeholders[index]),)
    if op.op == "call":
        return interpret(program, op.attr("callee"), *args)
    if op.op == "reverse_mode":
        transformed = gradient_function(program, op.attr("callee"), op.attr("wrt"))
        return interpret(transformed.program, transformed.name, *args)
    definition = REGISTRY.get(op.op)
    if definition is None:
        raise InterpreterError(f"no reference rule for op '{op.op}'")
    return tuple(definition.reference(args, op.attr_dict))
