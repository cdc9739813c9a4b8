"""Loop-IR verifier: every invariant the scheduling passes and codegen assume, checked on
any kernel (lowered, after each pass, or read from a `.loops` file).

- buffers: unique names, known element types and roles, positive static dims; `inputs` and
  `outputs` name buffers of those roles, each output once; nothing stores to an input;
- variables: each loop and `let` variable is defined once in its top-level nest (passes
  substitute by name without scoping, `loopir.substitute`; fission's nests repeat the row
  loops' names, each nest its own), a reduction or gemm index shadows nothing
  in scope, every use is defined before it and in scope, with the type it was defined with;
- operations: names from the enums (`loopir.BinaryOp`, `UnaryOp`, `ReduceOp`, `LoopKind`),
  operand and result types as codegen types them (no float op on integers, comparisons give
  `i1`, indices are `i64`, a store's value has its buffer's value type);
- schedules: a vector loop's width and a vectorised reduction's are powers of two from 2 to
  64, thread counts at least 1, loop extents at least 1; only sum/max/maxnum run in vector
  tiles; a vector or parallel loop's iterations touch disjoint elements where one writes
  (the dependence test of tilegen/dependence.py); inside a tile no parallel loop and no
  store of a lane-varying value to one element; a gemm is a top-level statement whose A
  operand reads only (batch, i, k), its B operand (batch, k, j);
- bounds: an index component that is affine in loop and reduction variables (no loads or
  opaque terms) lies within its dimension over the whole iteration space; id checks name a
  check site of the kernel with a position of the site's rank.

`verify_kernel` raises `LoopIRVerifyError` (a KinaError, kind `ir`) naming the kernel, the
statement and the stage it ran after; `.stmt` is the offending statement, so the `.loops`
reader can point at its line and column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kina_frontend.diagnostics import KinaError, Span

from . import loopir as L
from .affine import to_affine, value_range
from .attention_ir import AttentionBackward, verify_attention_backward
from .dependence import independent

_FLOAT_ONLY_UNARY = {L.UnaryOp.EXP, L.UnaryOp.LOG, L.UnaryOp.SQRT, L.UnaryOp.TANH,
                     L.UnaryOp.ERF}
_INTEGER_ONLY_BINARY = {L.BinaryOp.FLOORDIV, L.BinaryOp.MOD}
_BOOL_BINARY = {L.BinaryOp.AND, L.BinaryOp.OR}
_ARITHMETIC = {L.BinaryOp.ADD, L.BinaryOp.SUB, L.BinaryOp.MUL, L.BinaryOp.DIV, L.BinaryOp.MAX,
               L.BinaryOp.MIN, L.BinaryOp.FLOORDIV, L.BinaryOp.MOD}
# Reductions codegen can run in vector tiles (schedule.py vectorises only these).
_VECTOR_REDUCTIONS = {L.ReduceOp.SUM, L.ReduceOp.MAX, L.ReduceOp.MAXNUM}
MAX_VECTOR_WIDTH = 64


class LoopIRVerifyError(KinaError):
    """The kernel breaks an invariant the passes assume."""

    def __init__(self, message: str, stmt: L.Stmt | None = None, span: Span | None = None):
        super().__init__("ir", message, span)
        self.reason = message
        self.stmt = stmt


def vector_width_problem(width: int) -> str | None:
    """Why `width` cannot be a vector width, or None when it can."""
    if width < 2 or width > MAX_VECTOR_WIDTH or width & (width - 1):
        return f"vector width {width} is not a power of two from 2 to {MAX_VECTOR_WIDTH}"
    return None


def _known(value: str, enum_type) -> bool:
    return value in enum_type._value2member_map_


@dataclass
class _Scope:
    """The variables visible at a point: name -> (type, extent or None for lets)."""

    frames: list[dict[str, tuple[str, int | None]]] = field(default_factory=lambda: [{}])

    def lookup(self, name: str) -> tuple[str, int | None] | None:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return None

    def extents(self) -> dict[str, int]:
        return {name: extent for frame in self.frames for name, (_, extent) in frame.items()
                if extent is not None}


class _Verifier:
    def __init__(self, kernel: L.Kernel, after: str | None):
        self.kernel = kernel
        self.where = f"@{kernel.name}" + (f" after {after}" if after else "")
        self.buffers: dict[str, L.Buffer] = {}
        self.defined: set[str] = set()  # loop and let variables of the current nest
        self.scope = _Scope()
        self.stmt: L.Stmt | None = None
        # Inside a vector loop's tile: its lane variable and the lets whose values vary
        # across the lanes (as codegen decides: they read the lane variable or such a let).
        self.lane: str | None = None
        self.varying: set[str] = set()
        self.depth = 0  # loops around the current statement

    def fail(self, message: str) -> LoopIRVerifyError:
        shown = ""
        if self.stmt is not None:
            text = L._format_stmt(self.stmt, 0)[0] if not isinstance(self.stmt, L.For) else \
                L._format_stmt(L.For(self.stmt.var, self.stmt.extent, (), self.stmt.kind,
                                     self.stmt.width, self.stmt.threads), 0)[0]
            shown = f" in `{text.strip()}`"
        return LoopIRVerifyError(f"loop IR {self.where}: {message}{shown}", self.stmt)

    # ---- kernel -------------------------------------------------------------------------------

    def kernel_header(self) -> None:
        kernel = self.kernel
        for buffer in kernel.buffers:
            if buffer.name in self.buffers:
                raise self.fail(f"buffer {buffer.name!r} is declared twice")
            if not _known(buffer.dtype, L.StorageType):
                raise self.fail(f"buffer {buffer.name!r} has unknown element type "
                                f"{buffer.dtype!r}")
            if not _known(buffer.role, L.BufferRole):
                raise self.fail(f"buffer {buffer.name!r} has unknown role {buffer.role!r}")
            if any(not isinstance(d, int) or d < 1 for d in buffer.shape):
                raise self.fail(f"buffer {buffer.name!r} has shape {list(buffer.shape)}: dims "
                                f"must be positive integers")
            self.buffers[buffer.name] = buffer
        for names, role in ((kernel.inputs, L.BufferRole.INPUT),
                            (kernel.outputs, L.BufferRole.OUTPUT)):
            for name in names:
                if name not in self.buffers or self.buffers[name].role != role:
                    raise self.fail(f"{role}s name {name!r}, which is no {role} buffer")
            declared = sorted(b.name for b in kernel.buffers if b.role == role)
            if sorted(names) != declared:
                raise self.fail(f"the {role}s {list(names)} are not the {role} buffers "
                                f"{declared}")
        for site in kernel.check_sites:
            if site.limit < 1:
                raise self.fail(f"check site of '{site.op}' has limit {site.limit}")

    def block(self, stmts: tuple[L.Stmt, ...]) -> None:
        self.scope.frames.append({})
        for stmt in stmts:
            self.statement(stmt)
        self.scope.frames.pop()

    def define(self, var: L.Var) -> None:
        if var.name in self.defined:
            raise self.fail(f"variable {var.name!r} is defined twice in one loop nest")
        self.defined.add(var.name)

    def statement(self, stmt: L.Stmt) -> None:
        self.stmt = stmt
        if isinstance(stmt, L.For):
            self.loop(stmt)
        elif isinstance(stmt, L.Let):
            self.expr(stmt.value)
            self.stmt = stmt
            if stmt.var.dtype != stmt.value.dtype:
                raise self.fail(f"let {stmt.var.name} is declared {stmt.var.dtype} but its "
                                f"value is {stmt.value.dtype}")
            self.define(stmt.var)
            self.scope.frames[-1][stmt.var.name] = (stmt.var.dtype, None)
            if self.lane_dependent(stmt.value):
                self.varying.add(stmt.var.name)
        elif isinstance(stmt, L.Store):
            buffer = self.access(stmt.buffer, stmt.index)
            if buffer.role == L.BufferRole.INPUT:
                raise self.fail(f"stores to the input {buffer.name!r}")
            self.expr(stmt.value)
            self.stmt = stmt
            if stmt.value.dtype != L.value_type(buffer.dtype):
                raise self.fail(f"stores a {stmt.value.dtype} value to {buffer.name!r}, whose "
                                f"elements take {L.value_type(buffer.dtype)}")
            if self.lane_dependent(stmt.value) and \
                    not any(self.lane_dependent(i) for i in stmt.index):
                raise self.fail(f"stores a value that varies across the lanes of vector loop "
                                f"{self.lane!r} to one element")
        elif isinstance(stmt, L.Gemm):
            if self.depth:
                raise self.fail("a gemm runs only as a top-level statement of its kernel")
            self.gemm(stmt)
        elif isinstance(stmt, L.Attention):
            if self.depth:
                raise self.fail("attention runs only as a top-level statement of its kernel")
            self.attention(stmt)
        elif isinstance(stmt, AttentionBackward):
            if self.depth:
                raise self.fail("attention backward runs only as a top-level statement")
            verify_attention_backward(self, stmt)
        else:
            raise self.fail(f"unknown statement {type(stmt).__name__}")

    def loop(self, loop: L.For) -> None:
        if not _known(loop.kind, L.LoopKind):
            raise self.fail(f"unknown loop kind {loop.kind!r}")
        if loop.var.dtype != L.I64:
            raise self.fail(f"loop variable {loop.var.name!r} is {loop.var.dtype}, not i64")
        if loop.extent < 1:
            raise self.fail(f"loop extent {loop.extent} (must be at least 1)")
        if loop.kind == L.LoopKind.VECTOR:
            problem = vector_width_problem(loop.width)
            if problem:
                raise self.fail(problem)
        elif loop.width < 1:
            raise self.fail(f"{loop.kind} loop has width {loop.width}")
        if loop.threads < 1 or (loop.threads > 1 and loop.kind != L.LoopKind.VECTOR):
            raise self.fail(f"threads={loop.threads} on a {loop.kind} loop (only vector loops "
                            f"split their tiles across threads)")
        if self.lane is not None and loop.kind == L.LoopKind.PARALLEL and loop.width > 1:
            raise self.fail(f"parallel loop inside the tile of vector loop {self.lane!r}")
        self.define(loop.var)
        saved = self.lane, set(self.varying)
        if self.lane is None and loop.kind == L.LoopKind.VECTOR:
            self.lane = loop.var.name
        self.scope.frames.append({loop.var.name: (L.I64, loop.extent)})
        self.depth += 1
        self.block(loop.body)
        self.depth -= 1
        self.scope.frames.pop()
        self.lane, self.varying = saved
        self.stmt = loop
        split = loop.kind == L.LoopKind.VECTOR or (loop.kind == L.LoopKind.PARALLEL and
                                                   loop.width > 1)
        if split and not independent(loop, loop.var.name, self.scope.extents()):
            raise self.fail(f"the iterations of {loop.kind} loop {loop.var.name!r} may touch "
                            f"one element, one of them writing (tilegen/dependence.py)")

    def lane_dependent(self, expr: L.Expr) -> bool:
        if self.lane is None:
            return False
        names = L.free_vars(expr)
        return self.lane in names or bool(names & self.varying)

    def gemm(self, gemm: L.Gemm) -> None:
        out = self.access(gemm.out, None)
        if out.role == L.BufferRole.INPUT:
            raise self.fail(f"gemm stores to the input {out.name!r}")
        shape = tuple(gemm.batch_extents) + (gemm.m, gemm.n)
        if out.shape != shape:
            raise self.fail(f"gemm writes {list(shape)} into {out.name!r} of shape "
                            f"{list(out.shape)}")
        # A bf16 gemm multiplies bf16 operands (f32 values that are exactly bf16) into f32.
        product = L.value_type(gemm.dtype)
        if gemm.dtype == L.BF16_STORAGE:
            if out.dtype != L.F32:
                raise self.fail(f"bf16 gemm into {out.name!r} ({out.dtype}, not f32)")
        elif gemm.dtype != L.value_type(out.dtype) or gemm.dtype not in L.FLOAT_TYPES:
            raise self.fail(f"gemm of {gemm.dtype} into {out.name!r} ({out.dtype})")
        if gemm.threads < 1 or min(gemm.tiles.mr, gemm.tiles.nr, gemm.tiles.kc, gemm.tiles.mc,
                                   gemm.tiles.nc) < 1:
            raise self.fail("gemm tiles and threads must be at least 1")
        batch = dict(zip((v.name for v in gemm.batch), gemm.batch_extents, strict=True))
        frame = {**{name: (L.I64, extent) for name, extent in batch.items()},
                 gemm.i.name: (L.I64, gemm.m), gemm.j.name: (L.I64, gemm.n),
                 gemm.k.name: (L.I64, gemm.k_extent)}
        if len(frame) != len(batch) + 3:
            raise self.fail("gemm index variables are not distinct")
        for name in frame:
            if self.scope.lookup(name) is not None:
                raise self.fail(f"gemm index {name!r} shadows a variable in scope")
        self.scope.frames.append(frame)
        batch_names = set(batch)
        reads = ((gemm.a_elem, "A", batch_names | {gemm.i.name, gemm.k.name}),
                 (gemm.b_elem, "B", batch_names | {gemm.k.name, gemm.j.name}))
        for operand, name, allowed in reads:
            stray = sorted(L.free_vars(operand) & set(frame) - allowed)
            if stray:  # A is packed per (i, k) and B per (k, j)
                raise self.fail(f"gemm operand {name} reads index {stray[0]!r}")
        for operand, _, _ in reads:
            self.expr(operand)
            if operand.dtype != product:
                raise self.fail(f"gemm operand is {operand.dtype}, the product {product}")
        self.scope.frames.pop()

    def attention(self, att: L.Attention) -> None:
        out = self.access(att.out, None)
        if out.role == L.BufferRole.INPUT:
            raise self.fail(f"attention stores to the input {out.name!r}")
        batch = tuple(att.batch_extents)
        if out.shape != batch + (att.tq, att.dv):
            raise self.fail(f"attention writes {list(batch + (att.tq, att.dv))} into "
                            f"{out.name!r} of shape {list(out.shape)}")
        if att.dtype != L.value_type(out.dtype) or att.dtype not in L.FLOAT_TYPES:
            raise self.fail(f"attention of {att.dtype} into {out.name!r} ({out.dtype})")
        for name, rank in ((att.q, 2), (att.kt, 3), (att.v, 2)):
            operand = self.access(name, None)
            if len(operand.shape) != len(batch) + rank or operand.shape[:len(batch)] != batch:
                raise self.fail(f"attention operand {name!r} of shape {list(operand.shape)} "
                                f"does not match the batch {list(batch)}")
        if att.stats is not None and self.access(att.stats, None).shape != batch + (att.tq, 3):
            raise self.fail(f"attention statistics {att.stats!r} are not "
                            f"{list(batch + (att.tq, 3))}")
        if self.access(att.q, None).shape[-2] != att.tq:
            raise self.fail(f"attention query {att.q!r} has not {att.tq} rows")
        if min(att.tq, att.tk, att.d_extent, att.dv, att.block_rows, att.block_keys,
               att.threads) < 1:
            raise self.fail("attention extents, blocks and threads must be at least 1")
        frame = {**{v.name: (L.I64, e) for v, e in zip(att.batch, batch, strict=True)},
                 att.i.name: (L.I64, att.tq), att.j.name: (L.I64, att.tk),
                 att.s.name: (att.dtype, None)}
        if len(frame) != len(batch) + 3:
            raise self.fail("attention index variables are not distinct")
        for name in frame:
            if self.scope.lookup(name) is not None:
                raise self.fail(f"attention index {name!r} shadows a variable in scope")
        self.scope.frames.append(frame)
        for score in (att.score, att.unmasked):
            self.expr(score)
            if score.dtype != att.dtype:
                raise self.fail(f"attention score is {score.dtype}, the product {att.dtype}")
        self.scope.frames.pop()

    def access(self, name: str, index: tuple[L.Expr, ...] | None) -> L.Buffer:
        buffer = self.buffers.get(name)
        if buffer is None:
            raise self.fail(f"unknown buffer {name!r}")
        if index is None:
            return buffer
        if len(index) != len(buffer.shape):
            raise self.fail(f"{name!r} has rank {len(buffer.shape)} but is indexed with "
                            f"{len(index)} component(s)")
        extents = self.scope.extents()
        for axis, (component, dim) in enumerate(zip(index, buffer.shape, strict=True)):
            self.expr(component)
            if component.dtype != L.I64:
                raise self.fail(f"index {axis} of {name!r} is {component.dtype}, not i64")
            span = value_range(to_affine(component), extents) \
                if not L.contains(component, (L.Load, L.CheckedId, L.Reduce)) else None
            if span is not None and (span[0] < 0 or span[1] >= dim):
                raise self.fail(f"index {axis} of {name!r} ({component}) ranges over "
                                f"[{span[0]}, {span[1]}], outside [0, {dim - 1}]")
        return buffer

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, expr: L.Expr) -> None:
        if isinstance(expr, L.Const):
            if not _known(expr.dtype, L.ScalarType):
                raise self.fail(f"constant {expr.value!r} has unknown type {expr.dtype!r}")
        elif isinstance(expr, L.Var):
            found = self.scope.lookup(expr.name)
            if found is None:
                raise self.fail(f"variable {expr.name!r} is used where it is not defined")
            if found[0] != expr.dtype:
                raise self.fail(f"variable {expr.name!r} is used as {expr.dtype} but defined "
                                f"as {found[0]}")
        elif isinstance(expr, L.Load):
            buffer = self.access(expr.buffer, expr.index)
            if expr.dtype != L.value_type(buffer.dtype):
                raise self.fail(f"load of {buffer.name!r} typed {expr.dtype}, but its "
                                f"elements read as {L.value_type(buffer.dtype)}")
        elif isinstance(expr, L.Binary):
            self.binary(expr)
        elif isinstance(expr, L.Unary):
            self.unary(expr)
        elif isinstance(expr, L.Select):
            for child in (expr.cond, expr.if_true, expr.if_false):
                self.expr(child)
            if expr.cond.dtype != L.BOOL:
                raise self.fail(f"select condition is {expr.cond.dtype}, not i1")
            if not expr.if_true.dtype == expr.if_false.dtype == expr.dtype:
                raise self.fail(f"select of {expr.if_true.dtype} and {expr.if_false.dtype} "
                                f"typed {expr.dtype}")
        elif isinstance(expr, L.Cast):
            self.expr(expr.operand)
            if not _known(expr.dtype, L.ScalarType):
                raise self.fail(f"cast to unknown type {expr.dtype!r}")
        elif isinstance(expr, L.Reduce):
            self.reduce(expr)
        elif isinstance(expr, L.CheckedId):
            self.checked_id(expr)
        else:
            raise self.fail(f"unknown expression {type(expr).__name__}")

    def binary(self, expr: L.Binary) -> None:
        if not _known(expr.op, L.BinaryOp):
            raise self.fail(f"unknown binary op {expr.op!r}")
        self.expr(expr.lhs)
        self.expr(expr.rhs)
        if expr.lhs.dtype != expr.rhs.dtype:
            raise self.fail(f"'{expr.op}' of {expr.lhs.dtype} and {expr.rhs.dtype}")
        expected = L.BOOL if expr.op in L.COMPARISONS else expr.lhs.dtype
        if expr.dtype != expected:
            raise self.fail(f"'{expr.op}' of {expr.lhs.dtype} typed {expr.dtype}, not "
                            f"{expected}")
        if expr.op in _INTEGER_ONLY_BINARY and expr.lhs.dtype != L.I64:
            raise self.fail(f"'{expr.op}' of {expr.lhs.dtype} (integers only)")
        if expr.op in _BOOL_BINARY and expr.lhs.dtype != L.BOOL:
            raise self.fail(f"'{expr.op}' of {expr.lhs.dtype} (i1 only)")
        if expr.op in _ARITHMETIC and expr.lhs.dtype == L.BOOL:
            raise self.fail(f"'{expr.op}' of i1 (no arithmetic on booleans)")

    def unary(self, expr: L.Unary) -> None:
        if not _known(expr.op, L.UnaryOp):
            raise self.fail(f"unknown unary op {expr.op!r}")
        self.expr(expr.operand)
        if expr.dtype != expr.operand.dtype:
            raise self.fail(f"'{expr.op}' of {expr.operand.dtype} typed {expr.dtype}")
        if expr.op in _FLOAT_ONLY_UNARY and expr.dtype not in L.FLOAT_TYPES:
            raise self.fail(f"'{expr.op}' of {expr.dtype} (floats only)")
        if expr.op in (L.UnaryOp.NEG, L.UnaryOp.ABS) and expr.dtype == L.BOOL:
            raise self.fail(f"'{expr.op}' of i1 (no arithmetic on booleans)")
        if expr.op == L.UnaryOp.ROUND_BF16 and expr.dtype != L.F32:
            raise self.fail(f"round_bf16 of {expr.dtype} (f32 only)")

    def reduce(self, expr: L.Reduce) -> None:
        if not _known(expr.op, L.ReduceOp):
            raise self.fail(f"unknown reduction {expr.op!r}")
        if expr.extent < 1:
            raise self.fail(f"reduction extent {expr.extent} (must be at least 1)")
        if expr.vector_width:
            problem = vector_width_problem(expr.vector_width)
            if problem:
                raise self.fail(f"reduction {problem}")
            if expr.op not in _VECTOR_REDUCTIONS:
                raise self.fail(f"{expr.op} cannot run in vector tiles (only "
                                f"{', '.join(sorted(_VECTOR_REDUCTIONS))})")
        if self.scope.lookup(expr.var.name) is not None:
            raise self.fail(f"reduction index {expr.var.name!r} shadows a variable in scope")
        self.scope.frames.append({expr.var.name: (L.I64, expr.extent)})
        self.expr(expr.body)
        self.scope.frames.pop()
        expected = L.I64 if expr.op == L.ReduceOp.ARGMAX else expr.body.dtype
        if expr.dtype != expected:
            raise self.fail(f"{expr.op} of {expr.body.dtype} typed {expr.dtype}")
        if expr.dtype == L.BOOL:
            raise self.fail(f"{expr.op} over i1 values")

    def checked_id(self, expr: L.CheckedId) -> None:
        self.expr(expr.value)
        for component in expr.position:
            self.expr(component)
        if expr.value.dtype != L.I64 or expr.dtype != L.I64:
            raise self.fail(f"checked id of {expr.value.dtype}, not i64")
        if not 0 <= expr.site < len(self.kernel.check_sites):
            raise self.fail(f"id check names site {expr.site}, but the kernel has "
                            f"{len(self.kernel.check_sites)}")
        site = self.kernel.check_sites[expr.site]
        if expr.limit != site.limit or len(expr.position) != len(site.ids_shape):
            raise self.fail(f"id check against {expr.limit} at rank {len(expr.position)} "
                            f"does not match site {expr.site} (limit {site.limit}, rank "
                            f"{len(site.ids_shape)})")


def verify_kernel(kernel: L.Kernel, after: str | None = None) -> L.Kernel:
    """`kernel` unchanged, or LoopIRVerifyError on the first broken invariant; `after`
    names the stage that produced it (for the message)."""
    verifier = _Verifier(kernel, after)
    verifier.kernel_header()
    for stmt in kernel.body:
        verifier.defined = set()  # fission's nests repeat their row loops' names
        verifier.statement(stmt)
    return kernel
