"""TTIR (a libtriton MLIR module) -> the tile IR.

The module is walked with libtriton's Python bindings (`module.walk`: op names, operands,
results, types, regions, blocks and their arguments, locations). The bindings do not expose
float constants or array and enum attributes, so those are read from the module's printed
text: a pre-order walk of the rebuilt tree and the ops of the printed text come in the same
order, and each op is paired with its own line (names are checked pairwise).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from .structurize import structurize
from .tileir import Block, Loc, Op, Param, Program, TileError, TileType, Value

_OP_LINE = re.compile(r'^\s*(?:\}\s*)?(?:%[\w#:.$-]+(?:\s*,\s*%[\w#:.$-]+)*\s*=\s*)?"?'
                      r'([a-z_][a-z0-9_]*\.[a-z0-9_.]+)"?')
_LOCATION = re.compile(r'"([^"]+)":(\d+):(\d+)')
_CMPI = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*([eE][-+]?\d+)?|inf|nan)$", re.IGNORECASE)


def parse_type(text: str) -> TileType:
    text = text.strip()
    if text.startswith("tensor<") and text.endswith(">"):
        inner = text[len("tensor<"):-1]
        dims = []
        while True:
            match = re.match(r"(\d+)x", inner)
            if not match:
                break
            dims.append(int(match.group(1)))
            inner = inner[match.end():]
        return TileType(_parse_elem(inner), tuple(dims))
    return TileType(_parse_elem(text))


def _parse_elem(text: str) -> str:
    text = text.strip()
    if text.startswith("!tt.ptr<") and text.endswith(">"):
        inner = text[len("!tt.ptr<"):-1]
        inner = inner.split(",")[0]  # address space, if printed
        return f"ptr<{_parse_elem(inner)}>"
    return text


def import_module(module, kernel_name: str, param_names: list[str]) -> Program:
    """The tile IR of the one public function in `module` (after inlining)."""
    tree = _ModuleTree(module)
    funcs = [op for op in tree.children_of_root() if tree.name(op) == "tt.func"]
    if len(funcs) != 1:
        raise _not_inlined(tree, funcs, kernel_name)
    lines = _pair_lines(tree, list(tree.preorder(funcs[0])), _op_lines(module.str_nodebug()))
    if lines is None:
        raise TileError(f"kernel `{kernel_name}`: the printed TTIR does not match the walked "
                        "module (an op printed in an unexpected form)")
    builder = _Builder(tree, lines, kernel_name)
    func = funcs[0]
    blocks = tree.blocks_of(func, 0)
    args = builder.block_args(blocks[0])
    divisibility = _arg_divisibility(lines[id(func)], len(args))
    if len(param_names) != len(args):
        param_names = [f"arg{i}" for i in range(len(args))]
    params = tuple(Param(name, value, div)
                   for name, value, div in zip(param_names, args, divisibility, strict=True))
    if len(blocks) == 1:
        body = Block(args, builder.ops(blocks[0]))
    else:  # branches between blocks (early returns): rebuilt as nested scf.if
        body = structurize(kernel_name, [Block(builder.block_args(block), builder.ops(block))
                                         for block in blocks])
    return Program(kernel_name, params, body)


def _not_inlined(tree, funcs: list, kernel_name: str) -> TileError:
    """The error for a module with other functions than the kernel: the first call left,
    with its line and why the inliner left it."""
    calls = [op for func in funcs for op in tree.preorder(func) if tree.name(op) == "tt.call"]
    if not calls:
        names = sorted(tree.name(op) for op in tree.children_of_root())
        return TileError(f"kernel `{kernel_name}`: expected one function after inlining, "
                         f"found {names}")
    call = calls[0]
    callee_name = call.get_flat_symbol_ref_attr("callee")
    callee = next((func for func in funcs if func.get_str_attr("sym_name") == callee_name),
                  None)
    loc = _location(call)
    where = f"kernel `{kernel_name}`" + (f" at {loc}" if loc else "")
    if callee is not None and len(tree.blocks_of(callee, 0)) > 1:
        why = ("it returns from inside an `if`, and MLIR inlines such a function only into "
               "the kernel's own body, not into a `for`, `while` or `if` body; let it "
               "return once (assign the result in each branch) or call it outside the loop")
    else:
        why = "noinline functions are not supported"
    short = callee_name.rsplit(".", 1)[-1].split("__")[0]  # Triton's module.name__types
    return TileError(f"{where}: the call of `{short}` is not inlined: {why}")


def _pair_lines(tree, order: list, text_lines: list[tuple[str, str]]) -> dict | None:
    """Each walked op's printed line; an operand-less `scf.yield` is not printed (MLIR
    elides implicit terminators)."""
    lines: dict[int, str] = {}
    position = 0
    for op in order:
        name = tree.name(op)
        if position < len(text_lines) and text_lines[position][0] == name:
            lines[id(op)] = text_lines[position][1]
            position += 1
        elif name == "scf.yield" and op.get_num_operands() == 0:
            lines[id(op)] = "scf.yield"
        else:
            return None
    return lines if position == len(text_lines) else None


class _ModuleTree:
    """The op tree rebuilt from a post-order walk: ops grouped by block, blocks by region,
    regions by op."""

    def __init__(self, module):
        self.ops: list = []
        self.block_ops: dict[int, list] = {}
        self.block_objects: dict[int, Any] = {}
        self.region_blocks: dict[int, list[int]] = {}
        self.op_regions: dict[int, list[int]] = {}
        self.root_block: int | None = None
        self._names: dict[int, str] = {}

        def visit(op):
            self.ops.append(op)  # keeps the Python wrappers (and their ids) alive
            self._names[id(op)] = op.get_name()
            self.op_regions[id(op)] = [op.get_region(i).id() for i in range(op.get_num_regions())]
            block = op.get_block()
            if block is None:
                return
            key = block.id()
            if key not in self.block_objects:
                self.block_objects[key] = block
                region = block.get_parent().id()
                self.region_blocks.setdefault(region, []).append(key)
            self.block_ops.setdefault(key, []).append(op)

        module.walk(visit)
        module_op = self.ops[-1]  # post-order: the module comes last
        self.root_block = self.region_blocks[self.op_regions[id(module_op)][0]][0]

    def name(self, op) -> str:
        return self._names[id(op)]

    def children_of_root(self):
        return self.block_ops.get(self.root_block, [])

    def blocks_of(self, op, region_index: int) -> list[int]:
        return self.region_blocks.get(self.op_regions[id(op)][region_index], [])

    def preorder(self, op):
        yield op
        for region in self.op_regions[id(op)]:
            for block in self.region_blocks.get(region, []):
                for child in self.block_ops.get(block, []):
                    yield from self.preorder(child)


class _Builder:
    def __init__(self, tree: _ModuleTree, lines: dict[int, str], kernel_name: str):
        self.tree = tree
        self.lines = lines
        self.kernel = kernel_name
        self.values: dict[int, Value] = {}

    def value(self, handle) -> Value:
        key = handle.id()
        if key not in self.values:
            self.values[key] = Value(len(self.values), parse_type(str(handle.get_type())))
        return self.values[key]

    def block_args(self, block_key: int) -> tuple[Value, ...]:
        block = self.tree.block_objects[block_key]
        return tuple(self.value(block.arg(i)) for i in range(block.get_num_arguments()))

    def ops(self, block_key: int) -> tuple[Op, ...]:
        return tuple(self.op(op) for op in self.tree.block_ops.get(block_key, []))

    def op(self, handle) -> Op:
        name = self.tree.name(handle)
        operands = tuple(self.value(handle.get_operand(i))
                         for i in range(handle.get_num_operands()))
        results = tuple(self.value(handle.get_result(i))
                        for i in range(handle.get_num_results()))
        regions = []
        for index in range(handle.get_num_regions()):
            blocks = self.tree.blocks_of(handle, index)
            if len(blocks) > 1:
                raise TileError(f"`{name}` in kernel `{self.kernel}`: regions with several "
                                "blocks (unstructured control flow) are not supported")
            if blocks:
                regions.append(Block(self.block_args(blocks[0]), self.ops(blocks[0])))
            else:
                regions.append(Block((), ()))
        loc = _location(handle)
        line = self.lines[id(handle)]
        try:
            attrs = _attributes(name, handle, line, results)
        except (ValueError, IndexError) as error:
            place = f" at {loc}" if loc else ""
            raise TileError(f"`{name}` in kernel `{self.kernel}`{place}: cannot read its "
                            f"attributes from `{line.strip()}` ({error})") from None
        return Op(name, results, operands, attrs, tuple(regions), loc)


def _location(handle) -> Loc | None:
    candidates = [handle.get_result(i) for i in range(handle.get_num_results())]
    operands = [handle.get_operand(i) for i in range(handle.get_num_operands())]
    # a branch is where its condition is (the `if`); other ops, where their last operand is
    candidates += operands if handle.get_name() == "cf.cond_br" else operands[::-1]
    for value in candidates:
        match = _LOCATION.search(str(value.get_loc()))
        if match:
            return Loc(match.group(1), int(match.group(2)), int(match.group(3)))
    return None


def _op_lines(text: str) -> list[tuple[str, str]]:
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("^", "module", "#")) or stripped in ("}", ")"):
            continue
        match = _OP_LINE.match(line)
        if match and not stripped.startswith("} else") and not stripped.startswith("} do"):
            lines.append((match.group(1), line))
    return lines


def _arg_divisibility(func_line: str, count: int) -> list[int]:
    result = [1] * count
    for match in re.finditer(r"%arg(\d+): [^{,)]*(?:<[^>]*>)?\s*\{([^}]*)\}", func_line):
        number = int(match.group(1))
        div = re.search(r"tt\.divisibility = (\d+)", match.group(2))
        if div and number < count:
            result[number] = int(div.group(1))
    return result


def _search(pattern: str, text: str) -> re.Match:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"no match for {pattern!r}")
    return match


def _int_attr(handle, key: str) -> int:
    value = handle.get_int_attr(key)
    if value is None:
        raise ValueError(f"no integer attribute `{key}`")
    return int(value)


def _attributes(name: str, handle, line: str, results) -> tuple[tuple[str, object], ...]:
    body = line.split("=", 1)[1] if re.match(r"^\s*%", line) else line
    if name == "arith.constant":
        return (("value", _constant(body, results[0].type)),)
    if name == "arith.cmpi":
        return (("predicate", _CMPI[_int_attr(handle, "predicate")]),)
    if name == "arith.cmpf":
        return (("predicate", _search(r"arith\.cmpf (\w+)", body).group(1)),)
    if name in ("tt.get_program_id", "tt.get_num_programs"):
        return (("axis", _int_attr(handle, "axis")),)
    if name == "tt.make_range":
        return (("start", _int_attr(handle, "start")), ("end", _int_attr(handle, "end")))
    if name in ("tt.expand_dims", "tt.reduce", "tt.split", "tt.gather"):
        return (("axis", _int_attr(handle, "axis")),) if name != "tt.split" else ()
    if name == "tt.scan":
        return (("axis", _int_attr(handle, "axis")),
                ("reverse", bool(handle.get_bool_attr("reverse"))))
    if name == "tt.trans":
        order = _search(r"order = array<i32: ([^>]*)>", body).group(1)
        return (("order", tuple(int(x) for x in order.split(","))),)
    if name == "tt.atomic_rmw":
        match = _search(r"tt\.atomic_rmw (\w+), (\w+), (\w+)", body)
        return (("kind", match.group(1)), ("sem", match.group(2)), ("scope", match.group(3)))
    if name == "tt.atomic_cas":
        match = _search(r"tt\.atomic_cas (\w+), (\w+)", body)
        return (("sem", match.group(1)), ("scope", match.group(2)))
    if name == "tt.extern_elementwise":
        symbol = _search(r'symbol = "([^"]*)"', body).group(1)
        return (("symbol", symbol),)
    if name == "tt.fp_to_fp":
        rounding = re.search(r"rounding = (\w+)", body)
        return (("rounding", rounding.group(1) if rounding else "rtne"),)
    if name == "arith.select" or name.startswith("math.") or name.startswith("arith."):
        return ()
    if name in ("tt.print", "tt.assert"):
        message = re.search(r'"((?:[^"\\]|\\.)*)"', body)
        attrs: tuple[tuple[str, object], ...] = (
            ("message", message.group(1) if message else ""),)
        if name == "tt.print":
            attrs += (("hex", "hex = true" in body),)
        return attrs
    if name == "cf.br":
        (dest, count), = _successors(body)
        if count != handle.get_num_operands():
            raise ValueError("the branch's operands are not its block arguments")
        return (("dest", dest),)
    if name == "cf.cond_br":
        (true_dest, true_count), (false_dest, false_count) = _successors(body)
        if 1 + true_count + false_count != handle.get_num_operands():
            raise ValueError("the branch's operands are not its condition and block arguments")
        return (("true_dest", true_dest), ("false_dest", false_dest),
                ("true_count", true_count))
    if name == "tt.histogram":
        return ()
    if name == "tt.dot":  # ieee, Triton's default attribute value, is not printed
        precision = re.search(r"inputPrecision = (\w+)", body)
        return (("input_precision", precision.group(1) if precision else "ieee"),)
    return ()


def _successors(body: str) -> list[tuple[int, int]]:
    """(block number, operand count) of each successor of a printed branch: `^bb4` or
    `^bb4(%11, %12 : tensor<16xf32>, i32)`; blocks are numbered in their region's order."""
    return [(int(match.group(1)), (match.group(2) or "").count("%"))
            for match in re.finditer(r"\^bb(\d+)(?:\(([^)]*)\))?", body)]


def _constant(body: str, type_: TileType):
    text = body.split("arith.constant", 1)[1].rsplit(":", 1)[0].strip()
    if text.startswith("dense<"):
        text = text[len("dense<"):-1].strip()
        if text.startswith("["):
            raise ValueError("non-uniform dense constants are not supported")
    return _scalar_literal(text, type_.elem)


def _scalar_literal(text: str, elem: str):
    if text in ("true", "false"):
        return 1 if text == "true" else 0
    if elem in ("f16", "bf16", "f32", "f64"):
        if text.startswith("0x"):
            bits = int(text, 16)
            if elem == "f32":
                return struct.unpack("<f", struct.pack("<I", bits))[0]
            if elem == "f64":
                return struct.unpack("<d", struct.pack("<Q", bits))[0]
            if elem == "f16":
                return struct.unpack("<e", struct.pack("<H", bits))[0]
            return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
        if not _FLOAT_TEXT.match(text):
            raise ValueError(f"unreadable float constant {text!r}")
        return float(text)
    return int(text)
