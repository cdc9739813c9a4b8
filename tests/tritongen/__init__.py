"""A generator of random `@triton.jit` kernels, for differential tests of the tilegen Triton
backend against Triton's own interpreter (`TRITON_INTERPRET=1`).

`generate_kernel(rng)` returns a `GeneratedKernel`: the kernel's source text (a module
defining `kernel`, and the combine functions it calls), its grid, its arguments (tensors as
flat storages with the base offset the kernel is given, scalars, constexprs) and, per
output, how closely two runs must agree. Families of kernels, each with random expression
trees (`grow`) over what it loads:

- `flat`: a 1-D grid (or a 3-D one, linearised) over N elements; contiguous, gathered
  (`(offs * s) % N`) and reversed loads; blocks of 1..1024 lanes; masks written several
  ways, windows, true `multiple_of` / `max_contiguous` hints; `tl.histogram`.
- `tile`: 2-D tiles over an M x N problem (a 2-D grid either way round, a 1-D grid split
  in two, tutorial 03's grouped order, or a persistent loop over tiles); inputs with row
  strides (contiguous, padded, transposed; int64 offsets) or through tensor descriptors;
  row and column vectors broadcast with `[:, None]` / `[None, :]`; a fused softmax on a
  load whose masked lanes read -inf; a tile of infinities, signed zeros and subnormals.
- `rowloop`: blocks of rows, a loop over the columns in chunks (`range`, `tl.range`,
  `tl.static_range`, `while`, an advancing pointer tile) carrying accumulators (tiles,
  per-row vectors, a scalar), reduced, then a second loop using them (softmax, layer norm).
- `matmul`: a K loop of `tl.dot` (f32 `input_precision="ieee"`, integer-valued f32 and f16
  at the default precision too, int8 into int32): indexed or advancing pointers, wrapped
  (`% M`) offsets, b transposed, operands transformed (also per program), trip counts that
  differ between programs, K = 0, a rescaled accumulator; then an epilogue.
- `attention`: flash attention's forward loop (online softmax, exp or exp2, causal or not).
- `alias`, `alias2d`: programs storing into what they read (shifted, reversed, chunk by
  chunk, transposed) and reading it again, also through a second argument aliasing it.

Expressions: + - * / and float %, exp/log/sqrt/rsqrt/exp2/log2/erf/sin/cos/sigmoid,
floor/ceil/clamp/fma, abs, maximum/minimum, where on comparisons or on loaded booleans,
casts, integer // % (C semantics, negative and runtime divisors) and bit ops, broadcasting;
sum/max/min/argmax/argmin along an axis or the whole tile, broadcast back (also keep_dims),
cumsum (both directions), tl.reduce / associative_scan with combine functions, gather,
flip, sort, join/split, reshape, trans, `if` on scalars (scf.if) and early returns.
Outputs: tiles, per-row / per-column / per-program values, narrow stores (f16, f64, int8,
int16, bool), stores in place into inputs, values read back after their store,
atomic_add / max / min.

Sizes are odd (mostly 1..300 against blocks of 16..128), loads are masked with `other=`
(narrow loads: f16, f64, int8, int16, uint8, bool), and stores are masked (sometimes with
holes); outputs start at a sentinel, so a store outside its mask shows. Values carry
interval bounds (no overflow, `log` only of values >= 0.1, `sqrt` only of non-negative
ones, denominators away from zero) and an error bound: a value computed with correctly
rounded operations only (loads, + - * of such values where no multiply could be fused into
an add, abs, max, where, sqrt, casts, integer arithmetic, sums of integer-valued floats)
must agree bit for bit; otherwise within the tracked bound. Comparisons (in `where` and
masks) and argmax read only bit-exact values, so a one-ulp difference in `exp` never flips
a branch.

Run as a module, `python -m tests.tritongen <folder> <case>...` runs saved cases (see
`GeneratedKernel.save`) in this process and writes each case's outputs to
`<folder>/<case>/<mode>.npz` (or `<mode>_error.txt`); with `TRITON_INTERPRET=1` in the
environment that is the interpreter's run (the variable must be set before triton is
imported, so nothing here imports triton at module level).
"""

from __future__ import annotations

import numpy as np

from tests.tritongen.families import _family_alias2d, _family_flat, _family_tile
from tests.tritongen.loops import _family_alias, _family_attention, _family_matmul, _family_rowloop
from tests.tritongen.running import compare, import_kernel, launch, run_cases
from tests.tritongen.values import GeneratedKernel, TensorSpec, _Kernel

__all__ = ["GeneratedKernel", "TensorSpec", "compare", "generate_kernel", "import_kernel",
           "launch", "run_cases"]

FAMILIES = {"flat": (_family_flat, 3), "tile": (_family_tile, 4),
            "rowloop": (_family_rowloop, 2), "matmul": (_family_matmul, 2),
            "attention": (_family_attention, 1), "alias": (_family_alias, 1),
            "alias2d": (_family_alias2d, 0.5)}


def generate_kernel(rng: np.random.Generator) -> GeneratedKernel:
    names = list(FAMILIES)
    weights = np.array([FAMILIES[n][1] for n in names], dtype=float)
    family = names[int(rng.choice(len(names), p=weights / weights.sum()))]
    k = _Kernel(rng, family)
    FAMILIES[family][0](k)
    return k.finish()
