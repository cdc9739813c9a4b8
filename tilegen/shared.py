"""Top-level statements that repeat, emitted once as a function and called at each place.

A transformer's layers are inlined into one kernel, so each layer's matmuls, layer norms and
softmax appear six times, identical up to the buffers they touch and the names of their
loop variables. Generated inline, each copy is its own packing loops, parallel region and
micro-kernel calls, and LLVM optimises and compiles every copy (MiniLM: 63 parallel
regions, 4.9 MB of IR, 5 s of compile for one (B, T) shape). Here each top-level `Gemm`,
fused `Attention` or loop nest whose canonical form (buffers and variables renamed in order
of appearance, buffer types and shapes, kernel outputs marked) occurs more than once becomes
one function

    i64 @<kernel>.shared<N>(ptr buffer0, ..., ptr bufferK, scalars..., ptr err)

generated from its first occurrence by the ordinary statement code generator, so its
loops (and the parallel regions and micro-kernel calls inside) are exactly those the
inline copy would have. Each occurrence calls it with its own buffers. Its status is the
kernel's: 0, 1 + a failed id check's site (with `err` filled in), or -1 when a block could
not be allocated; a non-zero status ends the kernel there as an inline failure would.

Buffers touched by one top-level statement never share memory (tilegen/frame.py gives
them disjoint live ranges; the entries reject outputs overlapping any argument), so each
parameter the statement writes is `noalias`. Variables the statement reads but does not
bind (top-level `let`s, such as a rank-1 softmax's maximum and sum) are passed by value
after the buffers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from llvmlite import ir

from . import loopir as L
from .codegen import KernelCodegen
from .codegen_values import I64, PTR, Val


@dataclass(frozen=True)
class Form:
    """A statement's canonical form: statements with equal keys generate the same code
    given their own buffers in the order of `buffers`."""

    key: tuple
    buffers: tuple[str, ...]  # in order of first appearance
    written: frozenset[str]  # the buffers it stores to
    scalars: tuple[str, ...]  # variables it reads but does not bind (top-level lets)


def canonical_form(stmt: L.Stmt, buffers: dict[str, L.Buffer]) -> Form | None:
    """None when `stmt` is not a loop nest, gemm or fused attention."""
    if not isinstance(stmt, (L.For, L.Gemm, L.Attention)):
        return None
    renamer = _Renamer()
    renamed = renamer.stmt(stmt)
    types = tuple((buffers[name].dtype, buffers[name].shape) for name in renamer.buffers)
    scalars = tuple(name for name in renamer.used if name not in renamer.bound)
    return Form((renamed, types, tuple(renamer.constants)), tuple(renamer.buffers),
                frozenset(renamer.written), scalars)


class _Renamer:
    """Rebuilds a statement with buffers named b0, b1, ... and variables v0, v1, ... in
    order of appearance."""

    def __init__(self):
        self.buffers: dict[str, str] = {}
        self.vars: dict[str, str] = {}
        self.bound: set[str] = set()
        self.used: dict[str, None] = {}  # in order of first use
        self.written: set[str] = set()
        # Float constants spelled out: 0.0 == -0.0 (and they hash alike), but x * -0.0 is
        # not x * 0.0.
        self.constants: list[str] = []

    def buffer(self, name: str) -> str:
        return self.buffers.setdefault(name, f"b{len(self.buffers)}")

    def var(self, var: L.Var, binds: bool = False) -> L.Var:
        if binds:
            self.bound.add(var.name)
        else:
            self.used.setdefault(var.name)
        return L.Var(self.vars.setdefault(var.name, f"v{len(self.vars)}"), var.dtype)

    def stmt(self, stmt: L.Stmt) -> L.Stmt:
        if isinstance(stmt, L.For):
            var = self.var(stmt.var, binds=True)
            return L.For(var, stmt.extent, tuple(self.stmt(s) for s in stmt.body), stmt.kind,
                         stmt.width, stmt.threads)
        if isinstance(stmt, L.Let):
            value = self.expr(stmt.value)
            return L.Let(self.var(stmt.var, binds=True), value)
        if isinstance(stmt, L.Store):
            self.written.add(stmt.buffer)
            return L.Store(self.buffer(stmt.buffer), tuple(self.expr(e) for e in stmt.index),
                           self.expr(stmt.value))
        if isinstance(stmt, L.Gemm):
            self.written.add(stmt.out)
            out = self.buffer(stmt.out)
            batch = tuple(self.var(v, binds=True) for v in stmt.batch)
            i, j, k = (self.var(v, binds=True) for v in (stmt.i, stmt.j, stmt.k))
            return L.Gemm(out, batch, stmt.batch_extents, i, j, k, stmt.m, stmt.n,
                          stmt.k_extent, self.expr(stmt.a_elem), self.expr(stmt.b_elem),
                          stmt.dtype, stmt.tiles, stmt.threads)
        if isinstance(stmt, L.Attention):
            self.written.add(stmt.out)
            out, q, kt, v = (self.buffer(name) for name in (stmt.out, stmt.q, stmt.kt, stmt.v))
            batch = tuple(self.var(var, binds=True) for var in stmt.batch)
            i, j, s = (self.var(var, binds=True) for var in (stmt.i, stmt.j, stmt.s))
            return replace(stmt, out=out, q=q, kt=kt, v=v, batch=batch, i=i, j=j, s=s,
                           score=self.expr(stmt.score), unmasked=self.expr(stmt.unmasked))
        raise TypeError(stmt)

    def expr(self, expr: L.Expr) -> L.Expr:
        if isinstance(expr, L.Const) and isinstance(expr.value, float):
            self.constants.append(repr(expr.value))
        if isinstance(expr, L.Var):
            return self.var(expr)
        if isinstance(expr, L.Load):
            return L.Load(self.buffer(expr.buffer), tuple(self.expr(e) for e in expr.index),
                          expr.dtype)
        if isinstance(expr, L.Reduce):
            var = self.var(expr.var, binds=True)
            return L.Reduce(expr.op, var, expr.extent, self.expr(expr.body), expr.dtype,
                            expr.vector_width)
        return L.map_children(expr, self.expr)


def _threaded_or_gemm(stmt: L.Stmt) -> bool:
    if isinstance(stmt, (L.Gemm, L.Attention)):
        return True
    if not isinstance(stmt, L.For):
        return False
    if (stmt.kind == L.LoopKind.PARALLEL and stmt.width > 1) or stmt.threads > 1:
        return True
    return any(_threaded_or_gemm(inner) for inner in stmt.body)


class SharedStatements:
    """The repeated statements of the kernel `cg` generates, and their functions."""

    def __init__(self, cg: KernelCodegen):
        self.cg = cg
        self.forms = [canonical_form(stmt, cg.buffers) for stmt in cg.kernel.body]
        counts = Counter(form.key for form in self.forms if form is not None)
        self.repeated = {key for key, count in counts.items() if count > 1}
        self.functions: dict[tuple, ir.Function] = {}

    def emit(self, position: int) -> bool:
        """Call the shared function for top-level statement `position`; False when that
        statement is not shared (generate it inline)."""
        form = self.forms[position]
        if form is None or form.key not in self.repeated:
            return False
        cg = self.cg
        scalars = [_lookup(cg, name) for name in form.scalars]
        function = self.functions.get(form.key)
        if function is None:
            name = f"{cg.function.name}.shared{len(self.functions) + 1}"
            child = SharedCodegen(cg, name, form, [value.type for value in scalars])
            child.stmt(cg.kernel.body[position])
            function = self.functions[form.key] = child.finish()
            if _threaded_or_gemm(cg.kernel.body[position]) and _without_loops(child):
                # Glue around parallel regions (their work is in functions of their own):
                # O3 spent ~8 ms on each (0.07 s of MiniLM's compile), and unoptimised its
                # few dozen instructions cost nanoseconds next to the region's fork/join.
                function.attributes.add("optnone")
            elif not _threaded_or_gemm(cg.kernel.body[position]):
                # A small serial nest: shared for the IR's size, inlined back by LLVM so
                # that no call is paid at run time (StoryLM-0's forward: 1.13 against
                # 1.07 us with its one repeated nest called).
                function.attributes.discard("noinline")
                function.attributes.add("alwaysinline")
        status = cg.b.call(function, [cg.pointers[name] for name in form.buffers] + scalars +
                           [cg.err])
        cg.exit_if_failed(status)
        return True


def _without_loops(child: KernelCodegen) -> bool:
    """Whether the function `child` generated has no loop: no branch back to a block
    appended before the branching one (codegen appends a loop's header before its body),
    the exit block (appended first) apart."""
    blocks = child.function.blocks
    order = {id(block): index for index, block in enumerate(blocks)}
    for index, block in enumerate(blocks):
        for target in getattr(block.terminator, "operands", ()):
            if isinstance(target, ir.Block) and target is not child.exit_block and \
                    order[id(target)] <= index:
                return False
    return True


def _lookup(cg: KernelCodegen, name: str) -> ir.Value:
    for scope in reversed(cg.env):
        if name in scope:
            return scope[name].value
    raise KeyError(f"shared statement reads '{name}', bound nowhere before it")


class SharedCodegen(KernelCodegen):
    """One shared statement as `i64 fn(ptr buffers..., scalars..., ptr err)`, generated like
    the kernel's own statements (parallel regions inside it are outlined from it)."""

    def __init__(self, parent: KernelCodegen, name: str, form: Form, scalar_types: list):
        self._start_helper(parent, ir.Function(parent.module, ir.FunctionType(
            I64, [PTR] * len(form.buffers) + scalar_types + [PTR]), name))
        self.function.attributes.add("noinline")  # the point: one copy, however many calls
        args = self.function.args
        for arg, buffer in zip(args, form.buffers, strict=False):
            arg.name = f"buf.{buffer}"
            arg.add_attribute("noundef")
            # Every buffer is a kernel argument (never null: the entries pass arrays of at
            # least one element, the C ABI rejects null), a stack slot or a piece of the
            # workspace after its allocation was checked. Said here, LLVM's value
            # propagation no longer walks the kernel's ~80 call sites to prove it for
            # each argument (~0.01 s of MiniLM's compile).
            arg.add_attribute("nonnull")
            if buffer in form.written:
                arg.add_attribute("noalias")
        self.pointers = dict(zip(form.buffers, args, strict=False))
        scalars = args[len(form.buffers):-1]
        for arg, var in zip(scalars, form.scalars, strict=True):
            arg.name = var
        self.env = [{var: Val(arg, False) for arg, var in zip(scalars, form.scalars,
                                                              strict=True)}]
        self.err = args[-1]
        self.err.name = "err"
        self.err.add_attribute("nonnull")

    def finish(self) -> ir.Function:
        return_status(self)
        return self.function


def return_status(cg: KernelCodegen) -> None:
    """End `cg`'s helper function: status 0 from where its builder is, and the exit block
    returning the status of whichever exit was taken."""
    cg.exit_with(ir.Constant(I64, 0))
    cg.b.position_at_end(cg.exit_block)
    status = cg.b.phi(I64, name="status")
    for value, block in cg.status_incoming:
        status.add_incoming(value, block)
    cg.b.ret(status)
