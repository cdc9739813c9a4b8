"""The tilegen backend's compiler: `ttir` (libtriton's own TTIR passes) -> `ttile` (our
tile IR, printed) -> `llir` (LLVM IR from tilegen's code generator) -> `obj` (machine
code for this CPU, the artifact Triton's disk cache keeps)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from types import ModuleType

from triton._C.libtriton import ir, passes
from triton.backends.compiler import BaseBackend, GPUTarget, Language

from ..config import triton_amx
from .tileir import TileError

BACKEND_NAME = "tilegen"


@dataclass(frozen=True)
class TilegenOptions:
    # GPU knobs Triton and autotune configs pass: accepted, recorded, ignored.
    num_warps: int = 4
    num_ctas: int = 1
    num_stages: int = 3
    warp_size: int = 1
    maxnreg: int | None = None
    ir_override: str | None = None
    enable_fp_fusion: bool = False
    launch_cooperative_grid: bool = False
    launch_pdl: bool = False
    extern_libs: tuple | None = None
    debug: bool = False
    sanitize_overflow: bool = False
    arch: str = ""
    backend_name: str = BACKEND_NAME
    instrumentation_mode: str = ""
    fpsan_homomorphic_casts: bool = False
    supported_fp8_dtypes: tuple[str, ...] = ()
    deprecated_fp8_dot_operand_dtypes: tuple[str, ...] = ()
    # A dot without input_precision is tf32 (tl.dot's default when the backend allows it):
    # on AMX as bf16x3, else exact fp32 (amx_dot.py). This default is for other callers.
    default_dot_input_precision: str = "ieee"
    allowed_dot_input_precisions: tuple[str, ...] = ("ieee", "tf32", "tf32x3", "bf16x3",
                                                     "bf16x6")
    max_num_imprecise_acc_default: int = 0
    # TILEGEN_TRITON_AMX (tilegen/config.py), `off` where this host may not use AMX: an
    # option, so the key of Triton's cache tells the kinds of code apart.
    amx_dot: str = "auto"

    def hash(self) -> str:
        key = "_".join(f"{name}-{value}" for name, value in sorted(self.__dict__.items()))
        return hashlib.sha256(key.encode()).hexdigest()


class TilegenBackend(BaseBackend):
    binary_ext = "obj"

    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == BACKEND_NAME

    def __init__(self, target: GPUTarget) -> None:
        super().__init__(target)
        self.binary_ext = "obj"

    def parse_options(self, options: dict) -> TilegenOptions:
        fields = TilegenOptions.__dataclass_fields__
        args = {k: v for k, v in options.items() if k in fields and v is not None}
        args["arch"] = str(self.target.arch)
        args["supported_fp8_dtypes"] = ()
        if "amx_dot" not in args:  # what this host allows, so the key tells them apart
            from .amx_dot import available
            mode = triton_amx()
            args["amx_dot"] = mode if available(mode) else "off"
        if "extern_libs" in args:
            args["extern_libs"] = tuple(dict(args["extern_libs"]).items())
        return TilegenOptions(**args)

    def pack_metadata(self, metadata):
        return (metadata.num_warps, metadata.num_ctas, metadata.shared)

    def get_codegen_implementation(self, options):
        # Any dot shape is fine on the CPU.
        return {"min_dot_size": lambda lhs_type, rhs_type: (1, 1, 1)}

    def get_module_map(self) -> dict[str, ModuleType]:
        from . import libdevice
        return {"triton.language.extra.libdevice": libdevice}

    def load_dialects(self, context) -> None:
        pass

    @staticmethod
    def make_ttir(module, metadata, options):
        pm = ir.pass_manager(module.context)
        pm.enable_debug()
        passes.common.add_inliner(pm)
        passes.ttir.add_rewrite_tensor_descriptor_to_pointer(pm)
        passes.common.add_canonicalizer(pm)
        passes.ttir.add_combine(pm)
        passes.ttir.add_reorder_broadcast(pm)
        passes.common.add_cse(pm)
        passes.common.add_symbol_dce(pm)
        passes.ttir.add_loop_unroll(pm)
        pm.run(module, "make_ttir")
        return module

    @staticmethod
    def make_ttile(module, metadata, options):
        from . import stages
        return stages.ttir_to_tile(module, metadata)

    @staticmethod
    def make_llir(tile_text, metadata, options):
        from . import stages
        return stages.tile_to_llvm(tile_text, metadata, options)

    @staticmethod
    def make_obj(llvm_text, metadata, options):
        from . import stages
        return stages.llvm_to_object(llvm_text)

    def add_stages(self, stages: dict, options: TilegenOptions, language: Language) -> None:
        if language != Language.TRITON:
            raise TileError(f"the tilegen backend compiles Triton kernels, not {language.name} "
                            "ones (Gluon kernels are written for GPU layouts)")
        stages["ttir"] = lambda src, metadata: self.make_ttir(src, metadata, options)
        stages["ttile"] = lambda src, metadata: self.make_ttile(src, metadata, options)
        stages["llir"] = lambda src, metadata: self.make_llir(src, metadata, options)
        stages["obj"] = lambda src, metadata: self.make_obj(src, metadata, options)

    @functools.lru_cache  # noqa: B019 (one backend object per target)
    def hash(self) -> str:
        return backend_hash()


@functools.cache
def backend_hash() -> str:
    """Every source of the compiler (the lowering calls into tilegen's gemm micro-kernel,
    vecmath, the target...), the toolchain and the host CPU's features: a change to any of
    them misses Triton's cache. The artifact is machine code for this CPU, and the GPUTarget
    names only its LLVM name, which two CPUs with different features can share."""
    from ..cache import compiler_fingerprint
    from ..target import host_target
    target = host_target()
    return hashlib.sha256(f"{compiler_fingerprint()};{target.cpu};{target.features}"
                          .encode()).hexdigest()
