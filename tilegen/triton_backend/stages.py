"""The backend's stage functions (compiler.py lists them in order)."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
from llvmlite import ir

from .. import target as host
from ..gcpause import collector_paused
from .emit import ProgramEmitter
from .grid import emit_launcher
from .hugepages import written_params
from .program_order import program_period
from .tileir import Program, TileError, format_program
from .ttir_import import import_module
from .verify import verify_program


class TileText(str):
    """The printed tile IR (what Triton stores for the `ttile` stage), carrying the
    program itself to the next stage of the same compile."""

    program: Program


# The stages pause Python's cyclic collector as tilegen's own compile does
# (tilegen/gcpause.py): the tile IR and llvmlite's IR live for the whole stage, and
# collections inside it only promoted them (~10^4 objects a compile) into the old
# generation, whose growth set off full collections of torch's and Triton's objects too
# (~0.3 s each in a test process, about every 8 compiles).


@collector_paused()
def ttir_to_tile(module, metadata) -> TileText:
    name = module.get_entry_func_name()
    program = import_module(module, name, _param_names(module))
    verify_program(program)
    text = TileText(format_program(program))
    text.program = program
    metadata["name"] = name
    return text


def _param_names(module) -> list[str]:
    """The kernel's parameter names, from the locations TTIR gives its arguments."""
    names: list[str] = []
    text = module.str()
    header = re.search(r"tt\.func [^@]*@\w+\((.*)\) attributes", text)
    if header:
        names = re.findall(r'loc\("([^"]+)"\(#loc\d*\)\)', header.group(1))
    return names


@collector_paused()
def tile_to_llvm(text: TileText, metadata, options) -> str:
    program = getattr(text, "program", None)
    if program is None:
        raise TileError("the ttile stage cannot be parsed back; compile from the kernel")
    module = ir.Module(name=program.name)
    module.triple = host.host_target().triple
    emitter = ProgramEmitter(program, module, debug=bool(options.debug),
                             amx_mode=getattr(options, "amx_dot", "auto"))
    function = emitter.emit()
    emit_launcher(module, function, program.name, tuple(emitter.launch_resets))
    metadata["shared"] = 0
    metadata["tilegen_frame_bytes"] = max(64, emitter.frame_bytes)
    metadata["tilegen_check_sites"] = emitter.check_sites
    metadata["tilegen_program_period"] = program_period(program)
    metadata["tilegen_disjoint_params"] = sorted(emitter.disjoint_params)
    metadata["tilegen_written_params"] = written_params(program)
    metadata["tilegen_amx"] = emitter.uses_amx  # the launcher asks Linux for tile data
    return str(module)


def llvm_to_object(text: str) -> bytes:
    with host.LLVM_LOCK:
        parsed = llvm.parse_assembly(text)
        parsed.verify()
        # Kernels run in this process: always this machine's target.
        machine = host.target_machine(host.host_target())
        parsed.triple = host.host_target().triple
        parsed.data_layout = str(machine.target_data)
        host.optimize(parsed, machine)
        return machine.emit_object(parsed)
