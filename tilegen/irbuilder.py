"""The IR builder the kernel code generators use: llvmlite's, with scalar integer
arithmetic folded on constants and repeated within a basic block computed once.

Packing loops, tile addressing and thread shares compute the same index arithmetic many
times over (each of a transposed block's 16 vectors computed its own copy of the row
offset), and a loop of one trip leaves arithmetic on constants. LLVM removes all of it
(EarlyCSE, InstCombine), but every instruction first costs Python to build and print,
LLVM to parse, and each pass until then to visit: building fewer is the cheapest part of
a compile. Only side-effect-free integer instructions on scalars are shared, and only
with an instruction earlier in the block the builder is appending to, which dominates
every later one; anything else (floats, vectors, loads, calls) is built as asked."""

from __future__ import annotations

from llvmlite import ir

_INT_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "and_": lambda a, b: a & b,
    "or_": lambda a, b: a | b,
    "shl": lambda a, b: a << b if 0 <= b < 64 else None,
    "ashr": lambda a, b: a >> b if 0 <= b < 64 else None,
    # sdiv/srem truncate toward zero, as LLVM's do; by zero is left to LLVM
    "sdiv": lambda a, b: None if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0)
                                                                 else -1),
    "srem": lambda a, b: None if b == 0 else a - b * (abs(a) // abs(b) *
                                                      (1 if (a < 0) == (b < 0) else -1)),
}
_SIGNED = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__,
           "==": int.__eq__, "!=": int.__ne__}


def _int_value(value: ir.Value) -> int | None:
    """The signed value of a scalar integer constant (None for anything else)."""
    if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) \
            and isinstance(value.constant, int):
        width = value.type.width
        number = int(value.constant) & ((1 << width) - 1)
        return number - (1 << width) if width > 1 and number >> (width - 1) else number
    return None


def _key(value: ir.Value):
    number = _int_value(value)
    return ("const", value.type.width, number) if number is not None else id(value)


def _fits(number: int, width: int) -> bool:
    return -(1 << (width - 1)) <= number < (1 << (width - 1))


class Builder(ir.IRBuilder):
    """llvmlite's IRBuilder with folding and block-local reuse of scalar integer ops."""

    def __init__(self, block: ir.Block | None = None):
        super().__init__(block)
        self._reuse: dict[tuple, ir.Value] = {}

    def _appending(self) -> bool:
        return self._block is not None and self._anchor == len(self._block.instructions)

    def _shared(self, key: tuple, build):
        """The instruction for `key` already in this block, else `build()`'s."""
        if not self._appending():
            return build()
        key = (id(self._block),) + key
        found = self._reuse.get(key)
        if found is not None and found.parent is self._block:
            return found
        made = build()
        self._reuse[key] = made
        return made


def _folding_binary(op: str):
    fold = _INT_BINARY[op]
    base = getattr(ir.IRBuilder, op)

    def method(self, lhs, rhs, name="", flags=()):
        if isinstance(lhs.type, ir.IntType) and lhs.type == rhs.type:
            a, b = _int_value(lhs), _int_value(rhs)
            if a is not None and b is not None:
                number = fold(a, b)
                if number is not None and _fits(number, lhs.type.width):
                    return ir.Constant(lhs.type, number)
            if op in ("add", "or_", "sub", "shl", "ashr") and b == 0:
                return lhs
            if op in ("add", "or_") and a == 0:
                return rhs
            if op == "mul" and (a == 1 or b == 1):
                return rhs if a == 1 else lhs
            if name == "":
                return self._shared((op, _key(lhs), _key(rhs), tuple(flags)),
                                    lambda: base(self, lhs, rhs, flags=flags))
        return base(self, lhs, rhs, name, flags)
    method.__name__ = op
    return method


for _name in _INT_BINARY:
    setattr(Builder, _name, _folding_binary(_name))


def _icmp_signed(self, cmpop, lhs, rhs, name=""):
    if isinstance(lhs.type, ir.IntType):
        a, b = _int_value(lhs), _int_value(rhs)
        if a is not None and b is not None:
            return ir.Constant(ir.IntType(1), int(_SIGNED[cmpop](a, b)))
        if name == "":
            return self._shared(("icmp", cmpop, _key(lhs), _key(rhs)),
                                lambda: ir.IRBuilder.icmp_signed(self, cmpop, lhs, rhs))
    return ir.IRBuilder.icmp_signed(self, cmpop, lhs, rhs, name)


def _select(self, cond, lhs, rhs, name="", flags=()):
    choice = _int_value(cond) if isinstance(cond.type, ir.IntType) and \
        cond.type.width == 1 else None
    if choice is not None:
        return lhs if choice else rhs
    if lhs is rhs:
        return lhs
    if name == "" and not flags and isinstance(lhs.type, ir.IntType):
        return self._shared(("select", _key(cond), _key(lhs), _key(rhs)),
                            lambda: ir.IRBuilder.select(self, cond, lhs, rhs))
    return ir.IRBuilder.select(self, cond, lhs, rhs, name, flags)


Builder.icmp_signed = _icmp_signed
Builder.select = _select
