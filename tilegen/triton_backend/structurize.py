"""A function body made of blocks and branches -> one block of nested `scf.if` ops.

Triton's frontend lowers an `if` that holds a `return` to branches between the blocks of
the `tt.func` body (`cf.cond_br`, `cf.br` with block arguments, a `tt.return` in several
blocks); the canonicalizer then merges blocks that read alike, so the graph is a DAG that
need not follow the source's nesting (two source `if`s may share a join). The lowering
knows structured control flow only, and the importer rebuilds such a body here:

- a `cf.br` to a block: that block's ops follow in line, its arguments renamed to the
  values branched with (no op is needed for them);
- a `cf.cond_br`: an `scf.if` on its condition, whose two arms run from the two
  successors up to the branch's immediate post-dominator, its join; the join's block
  arguments are the `scf.if`'s results, each arm yielding what it branches to the join
  with, and the join's ops follow the `scf.if`;
- when some path from the branch returns, the join is the function's exit: each arm runs
  to its returns, yielding what it returns (nothing, for a kernel), and the `scf.if` is
  the last op of its region. A block that both arms reach is then copied into each: the
  first copy keeps its value ids, later ones take fresh ids (the IR stays SSA).

The copies are bounded (`COPY_LIMIT` times the body's ops): a chain of `if`s whose
returning paths rejoin doubles the code after it at each one. Past the bound, or for a
graph with a cycle (the frontend builds loops as `scf.for`/`scf.while`, never from
branches), or a block ended by another op, the result is a TileError naming the kernel and
the branch's source line, before any code is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .tileir import Block, Loc, Op, TileError, TileType, Value, walk

EXIT = -1  # the function's exit: the post-dominator of every `tt.return` block
COPY_LIMIT = 16  # the structured body holds at most this many times the CFG's ops


@dataclass(frozen=True)
class Edge:
    dest: int  # the block's index in the function's region (TTIR's ^bbN)
    args: tuple[Value, ...]


def branch_edges(op: Op) -> tuple[Edge, ...]:
    """The successors of a block's terminator (none for `tt.return`)."""
    if op.name == "cf.br":
        return (Edge(op.attr("dest"), op.operands),)
    if op.name == "cf.cond_br":
        count = op.attr("true_count")
        return (Edge(op.attr("true_dest"), op.operands[1:1 + count]),
                Edge(op.attr("false_dest"), op.operands[1 + count:]))
    return ()


def structurize(kernel: str, blocks: list[Block]) -> Block:
    """One block for the function body `blocks` (blocks[0] the entry, each ended by
    `cf.br`, `cf.cond_br` or `tt.return`), ended by one `tt.return`."""
    return _Structurizer(kernel, blocks).body()


def _where(kernel: str, block: Block, op: Op) -> str:
    """`op` in `kernel` at its line, or at the last line its block has (a `cf.br` without
    operands carries no location)."""
    loc: Loc | None = op.loc
    for earlier in reversed(block.ops):
        if loc is not None:
            break
        loc = earlier.loc
    return f"`{op.name}` in kernel `{kernel}`" + (f" at {loc}" if loc else "")


class _Structurizer:
    def __init__(self, kernel: str, blocks: list[Block]):
        self.kernel = kernel
        self.blocks = blocks
        for block in blocks:
            self._check_terminator(block)
        self.order = self._topological_order()
        self.rank = {index: number for number, index in enumerate(self.order)}
        self.rank[EXIT] = len(self.order)
        self.ipdom = self._post_dominators()
        self.returns = self._return_types()
        self.next_id = 1 + max((value.id for value in _values(blocks)), default=-1)
        self.emitted: set[int] = set()  # blocks copied once already
        self.size = 0
        self.limit = COPY_LIMIT * sum(1 for block in blocks for _ in walk(block))
        self.branches: list[tuple[Block, Op]] = []  # the cond_brs being structurized

    # ---- the graph ----------------------------------------------------------------------

    def _fail(self, block: Block, op: Op, message: str) -> TileError:
        return TileError(f"{_where(self.kernel, block, op)}: {message}")

    def _check_terminator(self, block: Block) -> None:
        if not block.ops:
            raise TileError(f"kernel `{self.kernel}`: a block of the function body is empty")
        op = block.ops[-1]
        if op.name not in ("cf.br", "cf.cond_br", "tt.return"):
            raise self._fail(block, op, "a block of the function body ends with this op; "
                                        "only `cf.br`, `cf.cond_br` and `tt.return` are "
                                        "structurized")
        for edge in branch_edges(op):
            if not 0 < edge.dest < len(self.blocks):  # the entry block has no predecessor
                raise self._fail(block, op, f"a branch to block ^bb{edge.dest}, which the "
                                            "function body does not have")
            target = self.blocks[edge.dest]
            if [a.type for a in target.args] != [v.type for v in edge.args]:
                raise self._fail(block, op, f"the branch to ^bb{edge.dest} passes "
                                            f"{len(edge.args)} value(s) of other types than "
                                            f"the block's {len(target.args)} argument(s)")

    def _topological_order(self) -> list[int]:
        """The blocks reachable from the entry, each before its successors; a cycle is a
        TileError naming the branch that closes it."""
        state: dict[int, str] = {}
        post: list[int] = []
        stack: list[tuple[int, list[int]]] = [(0, self._successors(0))]
        state[0] = "open"
        while stack:
            index, pending = stack[-1]
            if not pending:
                stack.pop()
                state[index] = "done"
                post.append(index)
                continue
            dest = pending.pop()
            if state.get(dest) == "open":
                block = self.blocks[index]
                raise self._fail(block, block.ops[-1],
                                 f"the branch back to ^bb{dest} makes a loop of blocks; "
                                 "only acyclic branches (early returns) are structurized, "
                                 "loops must be `for` or `while` loops")
            if dest not in state:
                state[dest] = "open"
                stack.append((dest, self._successors(dest)))
        return post[::-1]

    def _successors(self, index: int) -> list[int]:
        dests = [edge.dest for edge in branch_edges(self.blocks[index].ops[-1])]
        return list(dict.fromkeys(dests))

    def _post_dominators(self) -> dict[int, int]:
        """Each block's immediate post-dominator (EXIT past the returns): the nearest common
        post-dominator of its successors, found by climbing the tree towards the exit,
        which comes later in the topological order (Cooper, Harvey and Kennedy's
        intersection; one pass suffices on a DAG visited successors first)."""
        ipdom: dict[int, int] = {}

        def intersect(a: int, b: int) -> int:
            while a != b:
                if self.rank[a] < self.rank[b]:
                    a = ipdom[a]
                else:
                    b = ipdom[b]
            return a
        for index in reversed(self.order):
            successors = self._successors(index)
            join = successors[0] if successors else EXIT
            for successor in successors[1:]:
                join = intersect(join, successor)
            ipdom[index] = join
        return ipdom

    def _return_types(self) -> tuple[TileType, ...]:
        returns = [self.blocks[index].ops[-1] for index in self.order
                   if self.blocks[index].ops[-1].name == "tt.return"]
        types = {tuple(v.type for v in op.operands) for op in returns}
        if len(types) > 1:
            index = next(i for i in self.order if self.blocks[i].ops[-1] is returns[-1])
            raise self._fail(self.blocks[index], returns[-1],
                             "the returns of the function return different types")
        return types.pop() if types else ()

    # ---- the structured body ------------------------------------------------------------

    def body(self) -> Block:
        entry = self.blocks[0]
        ops, returned = self._region(0, entry.args, EXIT, {})
        return Block(entry.args, tuple(ops) + (Op("tt.return", (), returned),))

    def _region(self, start: int, incoming: tuple[Value, ...], stop: int,
                env: dict[int, Value]) -> tuple[list[Op], tuple[Value, ...]]:
        """The ops from block `start` (entered with `incoming` for its arguments) up to
        block `stop`, and the values it is entered with (for EXIT: the values returned).
        `env` renames the values of blocks copied a second time; each arm has its own."""
        ops: list[Op] = []
        index = start
        while index != stop:
            block = self.blocks[index]
            for arg, value in zip(block.args, incoming, strict=True):
                env[arg.id] = value
            fresh = index in self.emitted
            self.emitted.add(index)
            self._grow(block)
            ops.extend(self._copy(op, env, fresh) for op in block.ops[:-1])
            terminator = block.ops[-1]
            edges = branch_edges(terminator)
            if not edges:  # tt.return
                if stop != EXIT:
                    raise self._fail(block, terminator, "a return before the join of the "
                                                        "branch around it (structurizer)")
                return ops, self._mapped(terminator.operands, env)
            if len(edges) == 1:
                index, incoming = edges[0].dest, self._mapped(edges[0].args, env)
                continue
            join = self.ipdom[index]
            if join == EXIT and stop != EXIT:
                raise self._fail(block, terminator, "a branch that returns inside the arm "
                                                    "of another (structurizer)")
            self.branches.append((block, terminator))
            arms = [self._arm(edge, join, dict(env)) for edge in edges]
            self.branches.pop()
            types = self.returns if join == EXIT else tuple(a.type for a in
                                                            self.blocks[join].args)
            results = tuple(self._fresh(type_) for type_ in types)
            condition = self._mapped(terminator.operands[:1], env)
            ops.append(Op("scf.if", results, condition, (), tuple(arms), terminator.loc))
            if join == EXIT:
                return ops, results
            index, incoming = join, results
        return ops, incoming

    def _arm(self, edge: Edge, join: int, env: dict[int, Value]) -> Block:
        ops, yielded = self._region(edge.dest, self._mapped(edge.args, env), join, env)
        return Block((), tuple(ops) + (Op("scf.yield", (), yielded),))

    def _grow(self, block: Block) -> None:
        self.size += sum(1 for _ in walk(block))
        if self.size <= self.limit or not self.branches:
            return
        where_block, branch = self.branches[-1]
        raise self._fail(where_block, branch,
                         f"structurizing the early returns would copy the code after "
                         f"them into each branch that reaches it, more than {COPY_LIMIT} "
                         f"times the kernel's {self.limit // COPY_LIMIT} ops; let fewer "
                         "paths that pass a `return` rejoin (e.g. compute a flag and "
                         "return in one place)")

    # ---- renaming -----------------------------------------------------------------------

    def _fresh(self, type_: TileType) -> Value:
        value = Value(self.next_id, type_)
        self.next_id += 1
        return value

    def _mapped(self, values: tuple[Value, ...], env: dict[int, Value]) -> tuple[Value, ...]:
        return tuple(env.get(value.id, value) for value in values)

    def _define(self, value: Value, env: dict[int, Value], fresh: bool) -> Value:
        if not fresh:
            return value
        env[value.id] = self._fresh(value.type)
        return env[value.id]

    def _copy(self, op: Op, env: dict[int, Value], fresh: bool) -> Op:
        """`op` reading through `env`; with `fresh`, defining new values (entered in
        `env`). A copy is always a new object (the lowering keys its plans by `id(op)`);
        the first emission is the op itself when nothing changes."""
        operands = self._mapped(op.operands, env)
        regions = tuple(self._copy_block(region, env, fresh) for region in op.regions)
        results = tuple(self._define(value, env, fresh) for value in op.results)
        if not fresh and _same(operands, op.operands) and _same(regions, op.regions):
            return op
        return replace(op, operands=operands, regions=regions, results=results)

    def _copy_block(self, block: Block, env: dict[int, Value], fresh: bool) -> Block:
        args = tuple(self._define(arg, env, fresh) for arg in block.args)
        ops = tuple(self._copy(op, env, fresh) for op in block.ops)
        if not fresh and _same(ops, block.ops):
            return block
        return Block(args, ops)


def _same(new: tuple, old: tuple) -> bool:
    return all(a is b for a, b in zip(new, old, strict=True))


def _values(blocks: list[Block]):
    for block in blocks:
        yield from block.args
        for op in walk(block):
            yield from op.results
            for region in op.regions:
                yield from region.args
