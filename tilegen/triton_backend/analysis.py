"""Pointer analysis on the tile IR: each integer or pointer tile's stride along its last
axis (in units of the integer, or in bytes for pointers), or None when it is not constant.

A load or store whose pointer tile has the element size as its last-axis stride reads
contiguous runs along the innermost dimension (masked vector loads and stores); any other
pointer tile is gathered or scattered lane by lane. Loop-carried tiles (the pointer tiles
a matmul advances by BLOCK_K each trip) start from their initial values' strides and are
iterated to a fixed point.
"""

from __future__ import annotations

from .tileir import Block, Op, Program, TileType

Strides = dict[int, int | None]


def pointer_bytes(elem: str) -> int:
    """Bytes per element behind a `ptr<elem>` (booleans are stored as bytes)."""
    return {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4,
            "f64": 8}.get(elem, 8)


def last_axis_strides(program: Program) -> tuple[Strides, dict[int, int]]:
    """(strides by value id, known uniform integer constants by value id)."""
    state = _State()
    for param in program.params:
        state.stride[param.value.id] = 0
    state.block(program.body)
    return state.stride, state.constant


class _State:
    def __init__(self):
        self.stride: Strides = {}
        self.constant: dict[int, int] = {}

    def get(self, value) -> int | None:
        if not value.type.shape:
            return 0
        return self.stride.get(value.id)

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
            self._loop(op, op.operands[3:], op.regions[0], skip_args=1)
            return
        if name == "scf.while":
            for region in op.regions:
                for arg in region.args:
                    self.stride[arg.id] = None if arg.type.shape else 0
                self.block(region)
            for result in op.results:
                self.stride[result.id] = None if result.type.shape else 0
            return
        if name == "scf.if":
            outs = [self.block(region) for region in op.regions]
            for number, result in enumerate(op.results):
                values = {self.get(out[number]) for out in outs if len(out) > number}
                self.stride[result.id] = values.pop() if len(values) == 1 else None
            return
        for region in op.regions:
            for arg in region.args:
                self.stride[arg.id] = 0 if not arg.type.shape else None
            self.block(region)
        if not op.results:
            return
        result = op.result
        self.stride[result.id] = self._rule(op, result.type)
        if name == "arith.constant" and isinstance(op.attr("value"), int):
            self.constant[result.id] = op.attr("value")

    def _loop(self, op: Op, inits, body: Block, skip_args: int) -> None:
        args = body.args[skip_args:]
        current = [self.get(init) for init in inits]
        for _ in range(4):
            for arg, stride in zip(args, current, strict=True):
                self.stride[arg.id] = stride
            self.stride[body.args[0].id] = 0
            yields = self.block(body)
            following = [a if a == self.get(y) else None
                         for a, y in zip(current, yields, strict=True)]
            if following == current:
                break
            current = following
        else:
            current = [None] * len(args)
            for arg in args:
                self.stride[arg.id] = None
            self.block(body)
        for result, stride in zip(op.results, current, strict=True):
            self.stride[result.id] = stride

    def _rule(self, op: Op, type_: TileType) -> int | None:
        name = op.name
        if not type_.shape:
            return 0
        operands = op.operands
        if name in ("arith.constant", "tt.splat"):
            return 0
        if name == "tt.make_range":
            return 1
        if name == "tt.expand_dims":
            return 0 if op.attr("axis") == len(type_.shape) - 1 else self.get(operands[0])
        if name == "tt.broadcast":
            source = operands[0].type.shape
            if source[-1] == 1 and type_.shape[-1] != 1:
                return 0
            return self.get(operands[0])
        if name == "tt.reshape":
            same_last = operands[0].type.shape[-1:] == type_.shape[-1:]
            return self.get(operands[0]) if same_last else None
        if name == "tt.trans":
            order = op.attr("order")
            return self.get(operands[0]) if order[-1] == len(order) - 1 else None
        if name in ("arith.addi", "arith.subi"):
            a, b = self.get(operands[0]), self.get(operands[1])
            if a is None or b is None:
                return None
            return a + b if name == "arith.addi" else a - b
        if name == "arith.muli":
            a, b = self.get(operands[0]), self.get(operands[1])
            ca, cb = self.constant.get(operands[0].id), self.constant.get(operands[1].id)
            if a == 0 and b == 0:
                return 0
            if cb is not None and a is not None:
                return a * cb
            if ca is not None and b is not None:
                return b * ca
            return None
        if name == "tt.addptr":
            p, o = self.get(operands[0]), self.get(operands[1])
            if p is None or o is None:
                return None
            return p + o * pointer_bytes(type_.pointee)
        if name in ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast",
                    "tt.bitcast", "tt.int_to_ptr", "tt.ptr_to_int"):
            return self.get(operands[0])
        if name == "arith.select":
            a, b = self.get(operands[1]), self.get(operands[2])
            return a if a == b else None
        return None
