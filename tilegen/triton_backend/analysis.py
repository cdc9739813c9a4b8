"""Pointer analysis on the tile IR: each integer or pointer tile's stride along each of its
axes (in units of the integer, or in bytes for pointers), None where it is not constant.

A load or store whose pointer tile has the element size as its last-axis stride reads
contiguous runs along the innermost dimension (masked vector loads and stores); one with
the element size as its stride along the axis before (a transposed read, as attention's
K^T) reads contiguous columns; any other pointer tile is tested per chunk for a run of
consecutive addresses and otherwise gathered or scattered lane by lane. Loop-carried tiles
(the pointer tiles a matmul advances by BLOCK_K each trip) start from their initial
values' strides and are iterated to a fixed point.
"""

from __future__ import annotations

from .tileir import Block, Op, Program, TileType, element_bytes

Stride = int | None
Strides = dict[int, tuple[Stride, ...]]


def axis_strides(program: Program) -> Strides:
    """Strides by value id, one per axis (scalars: the empty tuple)."""
    state = _State()
    state.block(program.body)
    return state.stride


def _unknown(type_: TileType) -> tuple[Stride, ...]:
    return (None,) * len(type_.shape)


def _zero(type_: TileType) -> tuple[Stride, ...]:
    return (0,) * len(type_.shape)


def _combine(a, b, fn) -> tuple[Stride, ...]:
    return tuple(None if x is None or y is None else fn(x, y)
                 for x, y in zip(a, b, strict=True))


class _State:
    def __init__(self):
        self.stride: Strides = {}
        self.constant: dict[int, int] = {}

    def get(self, value) -> tuple[Stride, ...]:
        if not value.type.shape:
            return ()
        return self.stride.get(value.id, _unknown(value.type))

    def block(self, block: Block) -> list:
        yields = []
        for op in block.ops:
            if op.name in ("scf.yield", "scf.condition"):
                yields = list(op.operands)
            self.op(op)
        return yields

    def op(self, op: Op) -> None:
        name = op.name
        if name == "scf.for":
            self._loop(op, op.operands[3:], op.regions[0])
            return
        if name == "scf.if":
            outs = [self.block(region) for region in op.regions]
            for number, result in enumerate(op.results):
                values = {self.get(out[number]) for out in outs if len(out) > number}
                self.stride[result.id] = values.pop() if len(values) == 1 else \
                    _unknown(result.type)
            return
        for region in op.regions:  # while loops, combine regions: nothing is assumed
            for arg in region.args:
                self.stride[arg.id] = _unknown(arg.type)
            self.block(region)
        for result in op.results:
            self.stride[result.id] = _unknown(result.type)
        if len(op.results) != 1:
            return
        result = op.result
        self.stride[result.id] = self._rule(op, result.type)
        if name == "arith.constant" and isinstance(op.attr("value"), int):
            self.constant[result.id] = op.attr("value")
        if name == "tt.splat" and op.operands[0].id in self.constant:
            self.constant[result.id] = self.constant[op.operands[0].id]

    def _loop(self, op: Op, inits, body: Block) -> None:
        args = body.args[1:]
        current = [self.get(init) for init in inits]
        for _ in range(4):
            for arg, stride in zip(args, current, strict=True):
                self.stride[arg.id] = stride
            yields = self.block(body)
            following = [a if a == self.get(y) else _unknown(arg.type)
                         for a, y, arg in zip(current, yields, args, strict=True)]
            if following == current:
                break
            current = following
        else:
            current = [_unknown(arg.type) for arg in args]
            for arg, stride in zip(args, current, strict=True):
                self.stride[arg.id] = stride
            self.block(body)
        for result, stride in zip(op.results, current, strict=True):
            self.stride[result.id] = stride

    def _rule(self, op: Op, type_: TileType) -> tuple[Stride, ...]:
        name = op.name
        if not type_.shape:
            return ()
        operands = op.operands
        if name in ("arith.constant", "tt.splat"):
            return _zero(type_)
        if name == "tt.make_range":
            return (1,)
        if name == "tt.expand_dims":
            widened = list(self.get(operands[0]))
            widened.insert(op.attr("axis"), 0)
            return tuple(widened)
        if name == "tt.broadcast":
            source = self.get(operands[0])
            return tuple(0 if before == 1 and after != 1 else stride for stride, before, after
                         in zip(source, operands[0].type.shape, type_.shape, strict=True))
        if name == "tt.reshape":
            source = self.get(operands[0])
            same_last = operands[0].type.shape[-1:] == type_.shape[-1:]
            return _unknown(type_)[:-1] + source[-1:] if same_last else _unknown(type_)
        if name == "tt.trans":
            source = self.get(operands[0])
            return tuple(source[axis] for axis in op.attr("order"))
        if name in ("arith.addi", "arith.subi"):
            a, b = self.get(operands[0]), self.get(operands[1])
            return _combine(a, b, (lambda x, y: x + y) if name == "arith.addi" else
                            (lambda x, y: x - y))
        if name == "arith.muli":
            a, b = self.get(operands[0]), self.get(operands[1])
            ca, cb = self.constant.get(operands[0].id), self.constant.get(operands[1].id)
            if cb is not None:
                return tuple(None if x is None else x * cb for x in a)
            if ca is not None:
                return tuple(None if y is None else y * ca for y in b)
            return tuple(0 if x == 0 and y == 0 else None for x, y in zip(a, b, strict=True))
        if name == "tt.addptr":
            size = element_bytes(type_.pointee)
            return _combine(self.get(operands[0]), self.get(operands[1]),
                            lambda p, o: p + o * size)
        if name in ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast",
                    "tt.bitcast", "tt.int_to_ptr", "tt.ptr_to_int"):
            return self.get(operands[0])
        if name == "arith.select":
            a, b = self.get(operands[1]), self.get(operands[2])
            return a if a == b else _unknown(type_)
        return _unknown(type_)
