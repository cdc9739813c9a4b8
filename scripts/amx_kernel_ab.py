#!/usr/bin/env python3
"""Time variants of the generated AMX micro-kernel from C, interleaved (ad hoc; not a
benchmark). Each variant is tilegen/amx_kernel.py with some module constants changed
(RUN_STEPS, STREAM_A, PREFETCH_C, C_ROWS_PER_STEP, PREFETCH_STEPS) and a flavour (packed
A or A read in place); its kernel is taken from the LLVM IR of a 1024^3 product, made
external, compiled into a shared library and called by a small C driver that runs gemm.py's
loop structure (column, depth and row blocks of amx_tiles' sizes) on one thread, each A
and B block copied into a buffer before its kernels as packing would, over a product of
bf16 ones. Prints the best time per variant and ns per tdpbf16ps.

    python scripts/amx_kernel_ab.py 1024 1024 1024 'runs=' 'one_run=RUN_STEPS:100000'
    python scripts/amx_kernel_ab.py 4096 1152 384 --in-place --a-offset 32 'x=' 'y=...'

Needs gcc and a CPU with AMX (the driver asks Linux for tile data first).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import llvmlite.binding as llvm

DRIVER = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
typedef void kfn(const void *a, const void *b, long steps, float *c, long ldc, long rows,
                 long cols, _Bool first, long blocks, long row_bytes, long step_bytes,
                 long main_steps, const void *tail, const void *ahead, long ahead_stride,
                 long ahead_rows, float *kept);
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no tile data"); return 1; }
  long M = atol(argv[1]), K = atol(argv[2]), N = atol(argv[3]), mc = atol(argv[4]),
       kc = atol(argv[5]), nc = atol(argv[6]), in_place = atol(argv[7]),
       offset = atol(argv[8]), reps = atol(argv[9]);
  int variants = argc - 10;
  uint16_t *A = aligned_alloc(64, M * K * 2 + 128), *B = aligned_alloc(64, K * N * 2);
  /* Panels padded to whole steps of 32 depths, as gemm_amx packs them. */
  uint16_t *Abuf = aligned_alloc(64, mc * (kc + 32) * 2);
  uint16_t *Bbuf = aligned_alloc(64, (kc + 32) * nc * 2);
  float *C = aligned_alloc(64, M * N * 4), *kept = aligned_alloc(64, mc * 32 * 4);
  A += offset / 2;
  for (long i = 0; i < M * K; i++) A[i] = 0x3f80;
  for (long i = 0; i < K * N; i++) B[i] = 0x3f80;
  kfn *kernels[32]; double best[32];
  for (int v = 0; v < variants; v++) {
    void *h = dlopen(argv[10 + v], RTLD_NOW);
    if (!h) { puts(dlerror()); return 1; }
    kernels[v] = (kfn *)dlsym(h, "kernel"); best[v] = 1e30;
  }
  memset(C, 0, M * N * 4);
  for (long r = -1; r < reps; r++)  /* round -1: warm-up, not timed */
    for (int v = 0; v < variants; v++) {
      double t = now();
      for (long jc = 0; jc < N; jc += nc)
        for (long pc = 0; pc < K; pc += kc) {
          long kb = K - pc < kc ? K - pc : kc, nb = N - jc < nc ? N - jc : nc;
          memcpy(Bbuf, B + jc * K + pc * nb, kb * nb * 2);
          for (long ic = 0; ic < M; ic += mc) {
            long mb = M - ic < mc ? M - ic : mc;
            const uint16_t *a = A + ic * K + pc;
            if (!in_place) { memcpy(Abuf, A + ic * K + pc * mb, kb * mb * 2); a = Abuf; }
            for (long jr = 0; jr < nb; jr += 32)
              kernels[v](a, Bbuf + jr * ((kb + 31) / 32 * 32), (kb + 31) / 32,
                         C + ic * N + jc + jr, N, M - ic, N - jc - jr, pc == 0, mb / 32,
                         in_place ? 2 * K : 64, in_place ? 64 : mc * 64, kb / 32, a, Bbuf,
                         0, 0, kept);
          }
        }
      t = now() - t;
      if (r >= 0 && t < best[v]) best[v] = t;
    }
  double dots = (double)M * N * K / (16 * 16 * 32);
  for (int v = 0; v < variants; v++)
    printf("%-40s %9.3f ms  %6.2f ns/dot\n", argv[10 + v], best[v] * 1e3, best[v] * 1e9 / dots);
  return 0;
}
"""

SOURCE = """fn f(a: Tensor[BF16, [1024, 1000], @host], b: Tensor[BF16, [1000, 1024], @host],
     p: Tensor[BF16, [1024, 1024], @host], q: Tensor[BF16, [1024, 1024], @host])
    -> (Tensor[F32, [1024, 1024], @host], Tensor[F32, [1024, 1024], @host]) {
  return (matmul(a, b), matmul(p, q));
}"""


def _kernel_ir(settings: dict[str, int], in_place: bool) -> str:
    """The module text holding the variant's 32 x 32 kernel as an external `kernel`."""
    from kina_frontend import program_from_text
    from tilegen import amx_kernel
    from tilegen.api import compile_program
    from tilegen.pipeline import codegen
    from tilegen.runtime import program_of

    saved = {name: getattr(amx_kernel, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(amx_kernel, name, type(saved[name])(value))
        module = compile_program(program_from_text(SOURCE))
        text = str(codegen([program_of(module).plans["f"]]))
    finally:
        for name, value in saved.items():
            setattr(amx_kernel, name, value)
    name = "tilegen.gemm.amx.32x32" + (".in_place" if in_place else "")
    found = re.search(r'define internal void @"?' + re.escape(name) + r'"?\(.*?\n}\n', text,
                      re.S)
    if found is None:
        raise SystemExit(f"no {name} in the module")
    body = re.sub(r'define internal void @"?[^"(]+"?\(', 'define void @kernel(', found.group(0),
                  count=1)
    body = re.sub(r"\) #\d+ {", ") {", body, count=1)
    lines = text.splitlines()
    declarations = [line for line in lines if line.startswith("declare")]
    zeros = [line for line in lines if line.startswith('@"tilegen.gemm.amx.zeros"')
             or line.startswith("@tilegen.gemm.amx.zeros")]
    return "\n".join(zeros + declarations) + "\n" + body


def _shared_library(ir_text: str, path: Path) -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
        reloc="pic")
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
    builder.getModulePassManager().run(module, builder)
    obj = path.with_suffix(".o")
    obj.write_bytes(machine.emit_object(module))
    subprocess.run(["gcc", "-shared", "-o", str(path), str(obj)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("m", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("variants", nargs="+", help="name=CONST:value,... (empty: as is)")
    parser.add_argument("--in-place", action="store_true",
                        help="A read where it is (the in-place flavour), else packed")
    parser.add_argument("--a-offset", type=int, default=0,
                        help="bytes past a cache line where A starts (NumPy: 16 or 32)")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    os.environ["TILEGEN_BF16_DOT"] = "amx"
    os.environ["TILEGEN_NUM_THREADS"] = "1"
    from tilegen.gemm_bf16 import amx_tiles
    from tilegen.target import host_target

    tiles = amx_tiles(args.m, args.n, args.k, host_target())
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        driver = folder / "driver"
        (folder / "driver.c").write_text(DRIVER)
        subprocess.run(["gcc", "-O2", "-o", str(driver), str(folder / "driver.c"), "-ldl"],
                       check=True)
        libraries = []
        for variant in args.variants:
            name, _, spec = variant.partition("=")
            settings = {key: int(value) for key, value in
                        (item.split(":") for item in spec.split(",") if item)}
            library = folder / f"{name}.so"
            _shared_library(_kernel_ir(settings, args.in_place), library)
            libraries.append(str(library))
        print(f"{args.m} x {args.k} x {args.n}: {tiles}, A "
              f"{'in place' if args.in_place else 'packed'}")
        subprocess.run([str(driver), str(args.m), str(args.k), str(args.n), str(tiles.mc),
                        str(tiles.kc), str(tiles.nc), str(int(args.in_place)),
                        str(args.a_offset), str(args.reps), *libraries], check=True,
                       cwd=scratch)


if __name__ == "__main__":
    main()
