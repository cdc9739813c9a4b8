"""`triton.language.extra.libdevice` for the CPU: the functions kernels call by that name,
as `tt.extern_elementwise` calls of the C math library (asin -> asinf for f32)."""

from __future__ import annotations

from triton.language import core

_UNARY = ("asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
          "erfc", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
          "tan", "sqrt", "cbrt", "floor", "ceil", "trunc", "round", "fabs", "tgamma",
          "lgamma", "nearbyint", "rint")
_BINARY = ("pow", "atan2", "fmod", "hypot", "fmin", "fmax", "copysign")


def _table(name: str, arity: int) -> dict:
    return {(core.dtype("fp32"),) * arity: (name + "f", core.dtype("fp32")),
            (core.dtype("fp64"),) * arity: (name, core.dtype("fp64"))}


def _unary(name: str):
    table = _table(name, 1)

    def function(arg0, _semantic=None):
        return core.extern_elementwise("", "", [arg0], table, is_pure=True,
                                       _semantic=_semantic)
    function.__name__ = function.__qualname__ = name
    return core.extern(function)


def _binary(name: str):
    table = _table(name, 2)

    def function(arg0, arg1, _semantic=None):
        return core.extern_elementwise("", "", [arg0, arg1], table, is_pure=True,
                                       _semantic=_semantic)
    function.__name__ = function.__qualname__ = name
    return core.extern(function)


for _name in _UNARY:
    globals()[_name] = _unary(_name)
for _name in _BINARY:
    globals()[_name] = _binary(_name)
abs = globals()["fabs"]  # noqa: A001 (libdevice's name)
