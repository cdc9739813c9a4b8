"""Valid Kina names that collide with something on the host side: Python keywords,
builtins and dunder names, the generated symbols' prefixes, the module's and the
generated wrapper's own names, C and C++ keywords and macros. Shared by test_names and
test_cabi."""

from __future__ import annotations

import builtins
import keyword

from kina_frontend.checker import STRUCTURAL_CALLS
from kina_frontend.lexer import KEYWORDS
from kina_frontend.ops import REGISTRY

GENERATED = [
    # symbol prefixes and module-wide symbols, old and new
    "entry_f", "call_f", "packed_f", "kina_f", "runtime_table", "metadata", "tilegen",
    "kina", "blocks", "blockcount", "cycles", "disjoint", "par1", "kina_runtime_table",
    # the module's own API, the wrapper's names
    "kind", "plans", "functions", "function", "signatures", "path", "profile_address",
    "program_of", "_load", "_lock", "_functions", "_natives", "_empty", "_entry", "_slow",
    "_ndarray", "_keepalive", "_wrapper", "_shape0", "_dtype0", "_o0", "_p0", "o0", "arg0",
    "arg1", "out", "self", "slow_path", "plan", "params", "results",
    # dunder names objects have
    "__init__", "__class__", "__dict__", "__getattr__", "__getattribute__", "__setattr__",
    "__repr__", "__dir__", "__slots__", "__weakref__", "__module__", "__doc__", "__call__",
    "__new__", "__del__", "__eq__", "__hash__", "__reduce__", "__init_subclass__",
    "__name__", "__qualname__",
    # C, C++ and the header's own names
    "int", "char", "void", "class", "new", "delete", "this", "template", "NULL", "EOF",
    "size_t", "int64_t", "bool", "true", "false", "p0_x", "out0", "KINA_OK", "errno",
    "main_", "kina_last_error", "tilegen_run", "tilegen_fail", "a0", "addresses",
]


def valid_kina_name(name: str) -> bool:
    return (name.isidentifier() and name.isascii() and name not in KEYWORDS
            and name not in REGISTRY and name not in STRUCTURAL_CALLS)


def hostile_names() -> list[str]:
    names = (list(keyword.kwlist) + list(keyword.softkwlist) + dir(builtins)
             + [n for n in dir(object) if n.startswith("__")] + GENERATED)
    return list(dict.fromkeys(n for n in names if valid_kina_name(n)))


# Parameter pairs, each once a problem (duplicate, shadowing or reserved names).
PARAM_PAIRS = [("arg1", "_a"), ("_p0", "_p1"), ("out", "self"), ("o0", "_o0"),
               ("_entry", "_slow"), ("lambda", "None"), ("int", "class"), ("NULL", "size_t"),
               ("p0_x", "x"), ("arg0", "_p1"), ("out0", "p1_out0"), ("_empty", "_ndarray"),
               ("errno", "stdin")]


PARAM_NAMES = frozenset(name for pair in PARAM_PAIRS for name in pair)


def hostile_programs(shape: int = 5) -> list[tuple[list[str], str]]:
    """(function names, source) twice: the names no parameter uses, with hostile
    parameters; then the parameters' names as functions (a program cannot use a name for
    both)."""
    names = hostile_names()
    functions = [n for n in names if n not in PARAM_NAMES]
    as_functions = [n for n in names if n in PARAM_NAMES]
    return [(functions, hostile_program(functions, PARAM_PAIRS, shape)),
            (as_functions, hostile_program(as_functions, [("a", "b")], shape))]


def hostile_program(names: list[str], pairs, shape: int = 5) -> str:
    """One function per name: f_k(p, q) = p * (k + 1) + q, parameters from `pairs`."""
    ty = f"Tensor[F32, [{shape}], @host]"
    lines = []
    for index, name in enumerate(names):
        first, second = pairs[index % len(pairs)]
        lines.append(f"fn {name}({first}: {ty}, {second}: {ty}) -> {ty} {{ "
                     f"return add(mul({first}, {float(index + 1)}), {second}); }}")
    return "\n".join(lines) + "\n"
