"""Every name the generated code defines, made in one place.

Kina identifiers are `[A-Za-z_][A-Za-z0-9_]*`, so a program can name a function anything a
C or Python identifier can be: `entry_f`, `runtime_table`, `lambda`, `__init__`. Names
are therefore built so that no function name can make two of them coincide:

- internal symbols contain a `.`, which no identifier can: a function's kernel is
  `kina.<name>`, everything else it owns is `kina.<name>.<role>` (`entry`, `call`,
  `packed`, `blocks`, `blockcount`, `cycles`, `par<N>`, `shared<N>`, ...), and module-wide
  symbols are `tilegen.<what>` (one dot; shared helpers such as `tilegen.exp.v16f32` or
  `tilegen.gemm.f32.6x32.s1` have two or more);
- the C ABI (see tilegen.cabi) is `kina_<name>` per function plus the library's own
  `kina_last_error`, so a function named `last_error` is the one name the C ABI refuses.
"""

from __future__ import annotations

KERNEL_PREFIX = "kina."
C_PREFIX = "kina_"

# Module-wide symbols.
RUNTIME_TABLE = "tilegen.runtime_table"  # process addresses the Python entries compare with
METADATA = "tilegen.metadata"  # a library's description of its functions (JSON, NUL-ended)

# The C ABI's own function, and the Kina function name it takes away from the C ABI.
C_LAST_ERROR = C_PREFIX + "last_error"
C_RESERVED_NAMES = frozenset({"last_error"})


def kernel_symbol(function: str) -> str:
    """The kernel of Kina function `function`: `i64 (ptr buffers..., ptr error_record)`."""
    return KERNEL_PREFIX + function


def function_symbol(function: str, role: str) -> str:
    """A symbol Kina function `function` owns besides its kernel (`role` has no `.`)."""
    return f"{kernel_symbol(function)}.{role}"


def c_symbol(function: str) -> str:
    """The C ABI entry of Kina function `function`."""
    return C_PREFIX + function
