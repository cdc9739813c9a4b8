#!/usr/bin/env python3
"""Measure this core's issue rate and latency of zmm `vfmadd231ps` and `vdpbf16ps` (ad hoc;
not a benchmark): the ceilings of tilegen's fp32 and `vdpbf16ps` gemm kernels here.

Each case is a loop of `chains` independent accumulators, each updated once per trip by
the instruction (register operands, loop-invariant), compiled with llvmlite for the host
CPU and run for a fixed number of trips; the clock comes from a chain of dependent
one-cycle `add`s (inline assembly), so the figures are in cycles of the clock the core
really ran at (a VM's /proc/cpuinfo MHz may not be it; turbo moves it by a few per cent
between cases, so read the figures as +-5 %). One chain gives the latency,
many the throughput; the mixes show whether the two instructions share the FMA ports.
Flops count two per product (a `vdpbf16ps` lane does two products, an FMA lane one).
Then tilegen's two 12 x 32 micro-kernels (gemm_bf16.dot_micro_kernel and
micro_kernel.micro_kernel_function for f32) run alone on cache-resident panels, 256 steps
a call, called from a loop in LLVM: their rate without packing, C's misses or the block
loops.

    python scripts/bf16_peaks.py            # needs AVX512-BF16
"""

from __future__ import annotations

import ctypes
import time

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from tilegen.gemm_bf16 import dot_micro_kernel
from tilegen.micro_kernel import micro_kernel_function
from tilegen.target import host_target, new_target_machine

TRIPS = 20_000_000
CLOCK_ADDS = 9  # dependent adds per trip of the clock loop


def loop_ir(name: str, fmas: int, dots: int, lanes: int = 16) -> str:
    """`void name(i64 trips, ptr operands, ptr out)`: `fmas` FMA and `dots` vdpbf16ps
    accumulators of `lanes` f32, or the clock loop when both are 0."""
    vec, pairs = f"<{lanes} x float>", f"<{2 * lanes} x bfloat>"
    dot = f"@llvm.x86.avx512bf16.dpbf16ps.{32 * lanes}"
    phis, body = [], []
    if fmas == dots == 0:
        adds = "; ".join(["add $2, $0"] * CLOCK_ADDS)
        phis.append("%c = phi i64 [0, %entry], [%c.next, %loop]")
        body.append(f'%c.next = call i64 asm "{adds}", "=r,0,r"(i64 %c, i64 %t)')
        result, result_type = "%c.next", "i64"
    for j in range(fmas):
        phis.append(f"%f{j} = phi {vec} [zeroinitializer, %entry], [%f{j}.next, %loop]")
        body.append(f"%f{j}.next = call {vec} @llvm.fma.v{lanes}f32({vec} %x, {vec} %y, "
                    f"{vec} %f{j})")
    for j in range(dots):
        phis.append(f"%d{j} = phi {vec} [zeroinitializer, %entry], [%d{j}.next, %loop]")
        body.append(f"%d{j}.next = call {vec} {dot}({vec} %d{j}, {pairs} %p, {pairs} %q)")
    outs = [f"%f{j}.next" for j in range(fmas)] + [f"%d{j}.next" for j in range(dots)]
    total = []
    if outs:  # every accumulator feeds the stored result, so none is dead
        result, result_type = outs[0], vec
        for j, value in enumerate(outs[1:]):
            total.append(f"%sum{j} = fadd {vec} {result}, {value}")
            result = f"%sum{j}"
    nl = "\n  "
    return f"""
declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})
declare {vec} {dot}({vec}, {pairs}, {pairs})
define void @{name}(i64 %trips, ptr %operands, ptr %out) {{
entry:
  %x = load {vec}, ptr %operands, align 4
  %y = load {vec}, ptr %operands, align 4
  %p = load {pairs}, ptr %operands, align 4
  %q = load {pairs}, ptr %operands, align 4
  %t = load i64, ptr %operands, align 4
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i.next, %loop]
  {nl.join(phis)}
  {nl.join(body)}
  %i.next = add i64 %i, 1
  %more = icmp slt i64 %i.next, %trips
  br i1 %more, label %loop, label %done
done:
  {nl.join(total)}
  store {result_type} {result}, ptr %out, align 4
  ret void
}}"""


# (name, FMA chains, vdpbf16ps chains, f32 lanes)
CASES = [("fma zmm", 1, 0, 16), ("fma zmm", 8, 0, 16), ("fma zmm", 12, 0, 16),
         ("fma zmm", 24, 0, 16),
         ("vdpbf16ps zmm", 1, 0, 16), ("vdpbf16ps zmm", 4, 0, 16),
         ("vdpbf16ps zmm", 8, 0, 16), ("vdpbf16ps zmm", 12, 0, 16),
         ("vdpbf16ps zmm", 24, 0, 16), ("vdpbf16ps ymm", 12, 0, 8),
         ("mix zmm", 12, 12, 16), ("mix zmm", 16, 8, 16), ("mix zmm", 8, 16, 16)]


def main() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    if "+avx512bf16" not in features.split(","):
        raise SystemExit("this CPU has no AVX512-BF16")
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu, features=features, opt=3)
    # A case's name in the module: its chains (the vdpbf16ps-only ones list theirs as dots).
    cases = [("clock", 0, 0, 16)] + [
        (name, 0, fmas, lanes) if name.startswith("vdpbf16ps") else (name, fmas, dots, lanes)
        for name, fmas, dots, lanes in CASES]
    engine = None
    for number, (_, fmas, dots, lanes) in enumerate(cases):
        module = llvm.parse_assembly(loop_ir(f"case{number}", fmas, dots, lanes))
        module.verify()
        if engine is None:
            engine = llvm.create_mcjit_compiler(module, machine)
        else:
            engine.add_module(module)
    engine.finalize_object()
    operands = (ctypes.c_float * 64)(*([1e-3] * 64))
    out = (ctypes.c_float * 64)()
    signature = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
    best = [float("inf")] * len(cases)
    for _ in range(5):  # interleaved rounds, the best of each
        for number in range(len(cases)):
            function = signature(engine.get_function_address(f"case{number}"))
            start = time.thread_time()
            function(TRIPS, ctypes.addressof(operands), ctypes.addressof(out))
            best[number] = min(best[number], time.thread_time() - start)
    hertz = TRIPS * CLOCK_ADDS / best[0]
    print(f"{cpu}: clock {hertz / 1e9:.2f} GHz (dependent adds)")
    print("case                 chains  cycles/trip  FMA/cycle  dot/cycle  flops/cycle")
    peaks: dict[str, float] = {}
    for number, (name, fmas, dots, lanes) in enumerate(cases[1:], 1):
        cycles = best[number] * hertz / TRIPS
        flops = (2 * lanes * fmas + 4 * lanes * dots) / cycles
        peaks[name] = max(peaks.get(name, 0.0), flops)
        chains = f"{fmas}+{dots}" if name.startswith("mix") else str(fmas + dots)
        print(f"{name:20s} {chains:>6s} {cycles:12.2f} {fmas / cycles:10.2f} "
              f"{dots / cycles:10.2f} {flops:12.1f}")
    print(f"one core's peak at {hertz / 1e9:.2f} GHz: fp32 FMA "
          f"{peaks['fma zmm'] * hertz / 1e9:.0f} GF/s, vdpbf16ps "
          f"{peaks['vdpbf16ps zmm'] * hertz / 1e9:.0f} GF/s")
    micro_kernel_rates(hertz)


def _repeat(module: ir.Module, kernel: ir.Function, name: str, mr: int, nr: int) -> None:
    """`void name(ptr a, ptr b, ptr c, i64 calls, i64 steps)`: `kernel` `calls` times on the
    same panels, overwriting an mr x nr block of C (ldc 1024)."""
    i64, ptr = ir.IntType(64), ir.PointerType()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, i64, i64]),
                           name)
    a, b, c, calls, steps = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    entry, loop = builder.block, function.append_basic_block("loop")
    done = function.append_basic_block("done")
    builder.branch(loop)
    builder.position_at_end(loop)
    count = builder.phi(i64)
    count.add_incoming(ir.Constant(i64, 0), entry)
    builder.call(kernel, [a, b, steps, c, ir.Constant(i64, 1024), ir.Constant(i64, mr),
                          ir.Constant(i64, nr), ir.Constant(ir.IntType(1), 1)])
    following = builder.add(count, ir.Constant(i64, 1))
    count.add_incoming(following, loop)
    builder.cbranch(builder.icmp_signed("<", following, calls), loop, done)
    builder.position_at_end(done)
    builder.ret_void()


def _aligned(nbytes: int, bits: int, dtype) -> np.ndarray:
    """A 64-byte aligned array of nbytes filled with the bit pattern `bits` (1.0)."""
    raw = np.zeros(nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    view = raw[start:start + nbytes].view(dtype)
    view[:] = np.array(bits, dtype)
    return view


def micro_kernel_rates(hertz: float, mr: int = 12, nr: int = 32, steps: int = 256) -> None:
    target = host_target()
    module = ir.Module("micro_kernels")
    module.triple = target.triple
    dot = dot_micro_kernel(module, mr, nr, 2 * steps)
    f32 = micro_kernel_function(module, "f32", mr, nr, steps, 16)
    _repeat(module, dot, "repeat_dot", mr, nr)
    _repeat(module, f32, "repeat_f32", mr, nr)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, new_target_machine(target))
    engine.finalize_object()
    signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_int64)
    c = _aligned(mr * 1024 * 4, 0, np.float32)
    panels = {  # A's rows and B's panel, 1.0 everywhere (bf16 0x3f80)
        "repeat_dot": (_aligned(mr * 2 * steps * 2, 0x3F80, np.uint16),
                       _aligned(steps * nr * 2 * 2, 0x3F80, np.uint16), 4 * 16),
        "repeat_f32": (_aligned(mr * steps * 4, 1.0, np.float32),
                       _aligned(steps * nr * 4, 1.0, np.float32), 2 * 16)}
    calls = 20_000
    print(f"micro-kernels {mr} x {nr} alone, {steps} steps a call:")
    for name, (a, b, flops_per_instruction) in panels.items():
        function = signature(engine.get_function_address(name))
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            function(a.ctypes.data, b.ctypes.data, c.ctypes.data, calls, steps)
            best = min(best, time.thread_time() - start)
        cycles = best * hertz / (calls * steps)
        instructions = mr * nr // 16
        print(f"  {name[7:]}: {cycles:.1f} cycles a step, {instructions / cycles:.2f} "
              f"{'vdpbf16ps' if name.endswith('dot') else 'FMA'}/cycle, "
              f"{instructions * flops_per_instruction / cycles * hertz / 1e9:.0f} GF/s")


if __name__ == "__main__":
    main()
