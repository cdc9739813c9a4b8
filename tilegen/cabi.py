"""The C ABI of a tilegen library: `int32_t kina_<f>(const T *in..., T *out...)`.

Every compiled function gets a `packed` trampoline in LLVM IR, `i64 kina.<f>.packed(ptr
addresses)`, which calls the kernel with the buffer addresses (then the error record) read
from one array: the Python slow path calls it through ctypes with one argument whatever
the arity, and the C ABI calls it too.

The C ABI itself -- null and overlap checks, the thread-local message behind
`kina_last_error`, the library's metadata -- is a small C file generated here and compiled
by the system compiler that links the library: it needs a thread-local variable, which
llvmlite's IR builder cannot declare, and it is plain glue, clearer as C. The glue refers
to the kernels' symbols (which contain `.`, see tilegen.symbols) through asm labels and
never names anything after a Kina identifier except the `kina_<f>` entries themselves.
"""

from __future__ import annotations

import json
import re

import numpy as np
from llvmlite import ir

from kina_frontend.diagnostics import KinaError

from .signature import Signature
from .symbols import C_LAST_ERROR, C_RESERVED_NAMES, METADATA, c_symbol, function_symbol

I64 = ir.IntType(64)
PTR = ir.PointerType()

# Status codes of a C ABI call (the header defines them as KINA_* macros).
STATUS_CODES = (
    ("KINA_OK", 0, "the call succeeded"),
    ("KINA_ERROR_ID_OUT_OF_RANGE", 1, "an id was outside its table (nothing was read)"),
    ("KINA_ERROR_OUT_OF_MEMORY", 2, "temporary buffers could not be allocated"),
    ("KINA_ERROR_NULL_ARGUMENT", 3, "a buffer pointer was NULL"),
    ("KINA_ERROR_OVERLAP", 4, "an output overlaps another argument"),
    ("KINA_ERROR_NO_TILE_DATA", 5, "the OS refused the AMX tile state the code needs"),
)

# The C type of each element type, by NumPy dtype name.
C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "bool": "bool",
           "bfloat16": "uint16_t"}

C_KEYWORDS = frozenset((
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "bool", "true", "false", "alignas",
    "alignof", "and", "and_eq", "asm", "bitand", "bitor", "catch", "char8_t", "char16_t",
    "char32_t", "class", "compl", "concept", "consteval", "constexpr", "constinit",
    "const_cast", "co_await", "co_return", "co_yield", "decltype", "delete", "dynamic_cast",
    "explicit", "export", "friend", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "reinterpret_cast",
    "requires", "static_assert", "static_cast", "template", "this", "thread_local", "throw",
    "try", "typeid", "typename", "using", "virtual", "wchar_t", "xor", "xor_eq",
    # lowercase object-like macros of the C library's headers
    "errno", "stdin", "stdout", "stderr", "complex", "imaginary", "noreturn",
    "math_errhandling",
))
_GENERATED_NAME = re.compile(r"^(p\d+_|out\d+$)")


def build_packed_entry(module: ir.Module, kernel_fn: ir.Function, symbol: str) -> ir.Function:
    """`i64 symbol(ptr addresses)`: the kernel called on addresses[0..n) (buffers, then
    the error record)."""
    count = len(kernel_fn.args)
    packed = ir.Function(module, ir.FunctionType(I64, [PTR]), symbol)
    packed.attributes.add("nounwind")
    b = ir.IRBuilder(packed.append_basic_block("entry"))
    addresses = [b.load(b.gep(packed.args[0], [ir.Constant(I64, position)], source_etype=PTR),
                        typ=PTR) for position in range(count)]
    b.ret(b.call(kernel_fn, addresses))
    return packed


def check_c_names(signatures: list[Signature], spans: dict[str, object]) -> None:
    """The one name the C ABI cannot give a function: a KinaError at its definition."""
    for signature in signatures:
        if signature.name in C_RESERVED_NAMES:
            raise KinaError("name", f"function '{signature.name}' cannot be exported: its C "
                            f"name would be the library's own {C_LAST_ERROR}; rename it",
                            spans.get(signature.name))


def c_type(dtype: np.dtype, where: str) -> str:
    try:
        return C_TYPES[dtype.name]
    except KeyError:
        raise KinaError("unsupported", f"{where}: the C ABI has no type for dtype "
                        f"{dtype.name}", None) from None


def c_parameter_names(signature: Signature) -> list[str]:
    """Names for the prototype's parameters: the Kina name where C and C++ take it, else
    `p<position>_<name>`; outputs are `out<k>`. A kept name is never of either generated
    form, so all are distinct."""
    names = []
    for position, (name, _, _) in enumerate(signature.params):
        # Not a keyword, a reserved (`_x`, `a__b`, `size_t`) or macro-like (`NULL`) name.
        safe = (name not in C_KEYWORDS and not name.startswith("_") and "__" not in name
                and not name.endswith("_t") and name != name.upper()
                and not _GENERATED_NAME.match(name))
        names.append(name if safe else f"p{position}_{name}")
    return names + [f"out{k}" for k in range(len(signature.results))]


def _prototype(signature: Signature, names: list[str] | None = None) -> str:
    types = [f"const {c_type(d, signature.name)} *" for _, d, _ in signature.params]
    types += [f"{c_type(d, signature.name)} *" for d, _ in signature.results]
    names = names or c_parameter_names(signature)
    params = [f"{t}{n}" for t, n in zip(types, names, strict=True)] or ["void"]
    head = f"int32_t {c_symbol(signature.name)}("
    if len(head) + sum(len(p) + 2 for p in params) <= 100:
        return head + ", ".join(params) + ")"
    return head + "\n" + ",\n".join("    " + p for p in params) + ")"


def _guard(header_name: str) -> str:
    return "KINA_" + re.sub(r"[^A-Za-z0-9]", "_", header_name).upper().strip("_") + "_"


def header(signatures: list[Signature], header_name: str, library: str, source: str) -> str:
    guard = _guard(header_name)
    lines = [f"/* {header_name}: the C interface of {library}, compiled by tilegen",
             f" * from {source}.",
             " * Link with the library (and, for the .o and .a forms, -lgomp -lm).",
             " *",
             " * Each kina_<function> takes its inputs, then its outputs: C-contiguous",
             " * row-major buffers of the types and shapes given above it. The caller",
             " * allocates the outputs; they must not overlap any other argument. It returns",
             " * KINA_OK (0) or an error code, and kina_last_error() then describes the",
             " * failure. Calls are thread-safe; the parallel runtime starts on first use. */",
             f"#ifndef {guard}", f"#define {guard}", "",
             "#include <stdint.h>", "#ifndef __cplusplus", "#include <stdbool.h>", "#endif", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             "#ifndef KINA_OK"]
    lines += [f"#define {name} {value} /* {text} */" for name, value, text in STATUS_CODES]
    lines += ["#endif", "",
              "/* The message of this thread's most recent failed call (\"\" before any). */",
              f"const char *{C_LAST_ERROR}(void);", ""]
    for signature in signatures:
        names = c_parameter_names(signature)
        lines.append(f"/* {signature.name}")
        for name, (_, dtype, shape) in zip(names, signature.params, strict=False):
            lines.append(f" *   in  {name}: {c_type(dtype, signature.name)}{list(shape)}")
        for name, (dtype, shape) in zip(names[len(signature.params):], signature.results,
                                        strict=True):
            lines.append(f" *   out {name}: {c_type(dtype, signature.name)}{list(shape)}")
        lines += [" */", _prototype(signature, names) + ";", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def _c_string(text: str) -> str:
    """A C string literal of `text` (UTF-8; every byte outside printable ASCII escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\?':
            out.append("\\" + char)
        elif 32 <= byte < 127:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


_GLUE_RUNTIME = r"""
typedef int64_t (*tilegen_packed_fn)(void **addresses);

struct tilegen_site {
  const char *head;  /* "f(): gather at file:line:col: id " */
  const char *tail;  /* " of argument 'ids' is out of range [0, n)" */
  int rank;
  const int64_t *shape;
};

struct tilegen_function {
  const char *name;
  tilegen_packed_fn packed;
  void **blocks;  /* the kernel's block table pointer (see tilegen.codegen) */
  const int64_t *block_count;
  int inputs, outputs;
  const char *const *names;  /* input names */
  const int64_t *nbytes;  /* per buffer */
  const struct tilegen_site *sites;
};

static _Thread_local char tilegen_error_text[1024];

const char *kina_last_error(void) { return tilegen_error_text; }

static int tilegen_put(int at, const char *text) {
  while (*text && at + 1 < (int)sizeof tilegen_error_text) tilegen_error_text[at++] = *text++;
  tilegen_error_text[at] = 0;
  return at;
}

static int tilegen_put_int(int at, int64_t value) {
  char digits[24];
  int count = 0;
  uint64_t magnitude = value < 0 ? -(uint64_t)value : (uint64_t)value;
  do { digits[count++] = (char)('0' + magnitude % 10); magnitude /= 10; } while (magnitude);
  if (value < 0) digits[count++] = '-';
  char text[24];
  for (int i = 0; i < count; i++) text[i] = digits[count - 1 - i];
  text[count] = 0;
  return tilegen_put(at, text);
}

static int32_t tilegen_fail(const struct tilegen_function *f, int32_t code, const char *what,
                            int position, const char *rest) {
  int at = tilegen_put(tilegen_put(tilegen_put(0, f->name), "(): "), what);
  if (position >= 0 && position < f->inputs)
    at = tilegen_put(tilegen_put(tilegen_put(at, "argument '"), f->names[position]), "'");
  else if (position >= 0)
    at = tilegen_put_int(tilegen_put(at, "output "), position - f->inputs);
  tilegen_put(at, rest);
  return code;
}

static int32_t tilegen_id_error(const struct tilegen_function *f, const int64_t *record) {
  const struct tilegen_site *site = &f->sites[record[0]];
  int64_t index[16], position = record[2];
  int rank = site->rank <= 16 ? site->rank : 1;  /* deeper ids: the flat position */
  if (site->rank > 16) index[0] = position;
  for (int axis = site->rank - 1; axis >= 0 && site->rank <= 16; axis--) {
    index[axis] = position % site->shape[axis];
    position /= site->shape[axis];
  }
  int at = tilegen_put_int(tilegen_put(0, site->head), record[1]);
  at = tilegen_put(at, " at position [");
  for (int axis = 0; axis < rank; axis++)
    at = tilegen_put_int(axis ? tilegen_put(at, ", ") : at, index[axis]);
  tilegen_put(tilegen_put(at, "]"), site->tail);
  return KINA_ERROR_ID_OUT_OF_RANGE;
}

static int32_t tilegen_run(const struct tilegen_function *f, void **addresses) {
  int count = f->inputs + f->outputs;
  for (int i = 0; i < count; i++) {
    if (!addresses[i]) return tilegen_fail(f, KINA_ERROR_NULL_ARGUMENT, "", i, " is NULL");
  }
  /* Outputs are noalias to the kernel: no output may overlap any other buffer. */
  for (int out = f->inputs; out < count; out++) {
    uintptr_t start = (uintptr_t)addresses[out], end = start + (uintptr_t)f->nbytes[out];
    for (int other = 0; other < count; other++) {
      uintptr_t begin = (uintptr_t)addresses[other];
      if (other != out && f->nbytes[other] && f->nbytes[out]
          && begin < end && start < begin + (uintptr_t)f->nbytes[other])
        return tilegen_fail(f, KINA_ERROR_OVERLAP, "", out, " overlaps another argument; "
                            "outputs must not alias inputs or each other");
    }
  }
  int64_t record[3] = {0, 0, 0};
  addresses[count] = record;
  int64_t status = f->packed(addresses);
  if (status == 0) return KINA_OK;
  if (status == -2) /* gemm_amx.STATUS_NO_TILE_DATA */
    return tilegen_fail(f, KINA_ERROR_NO_TILE_DATA, "", -1,
                        "the OS refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)");
  if (status < 0)
    return tilegen_fail(f, KINA_ERROR_OUT_OF_MEMORY, "", -1,
                        "could not allocate temporary buffers");
  return tilegen_id_error(f, record);
}
"""


def glue_source(signatures: list[Signature], header_text: str, metadata: dict) -> str:
    """The C file that defines the C ABI (compiled with -std=c11)."""
    lines = ["/* Generated by tilegen: the C ABI of a Kina library (see tilegen/cabi.py). */",
             header_text,
             "extern void *calloc(__SIZE_TYPE__ count, __SIZE_TYPE__ size);",
             _GLUE_RUNTIME]
    table = []
    for index, signature in enumerate(signatures):
        name = signature.name
        lines += [f"extern int64_t tilegen_packed_{index}(void **) "
                  f"__asm__({_c_string(function_symbol(name, 'packed'))});",
                  f"extern void *tilegen_blocks_{index} "
                  f"__asm__({_c_string(function_symbol(name, 'blocks'))});",
                  f"extern const int64_t tilegen_block_count_{index} "
                  f"__asm__({_c_string(function_symbol(name, 'blockcount'))});"]
        names = ", ".join(_c_string(n) for n, _, _ in signature.params) or "0"
        lines.append(f"static const char *const tilegen_names_{index}[] = {{{names}}};")
        sizes = [int(np.prod(s, dtype=np.int64)) * d.itemsize for _, d, s in signature.params]
        sizes += [int(np.prod(s, dtype=np.int64)) * d.itemsize for d, s in signature.results]
        lines.append(f"static const int64_t tilegen_nbytes_{index}[] = "
                     f"{{{', '.join(map(str, sizes)) or '0'}}};")
        sites = []
        for number, site in enumerate(signature.check_sites):
            shape = ", ".join(str(extent) for extent in site.ids_shape) or "1"
            lines.append(f"static const int64_t tilegen_shape_{index}_{number}[] = {{{shape}}};")
            where = (f"argument '{site.ids_argument}'" if site.ids_argument
                     else "a computed ids tensor")
            head = f"{name}(): {site.op} at {site.location}: id "
            tail = f" of {where} is out of range [0, {site.limit})"
            sites.append(f"{{{_c_string(head)}, {_c_string(tail)}, {len(site.ids_shape)}, "
                         f"tilegen_shape_{index}_{number}}}")
        lines.append(f"static const struct tilegen_site tilegen_sites_{index}[] = "
                     f"{{{', '.join(sites) or '{0, 0, 0, 0}'}}};")
        table.append(f"{{{_c_string(name)}, tilegen_packed_{index}, &tilegen_blocks_{index}, "
                     f"&tilegen_block_count_{index}, {len(signature.params)}, "
                     f"{len(signature.results)}, tilegen_names_{index}, tilegen_nbytes_{index}, "
                     f"tilegen_sites_{index}}}")
    lines.append("static const struct tilegen_function tilegen_functions[] = {"
                 + (", ".join(table) or "{0}") + "};")
    for index, signature in enumerate(signatures):
        count = len(signature.params) + len(signature.results)
        params = [f"const {c_type(d, signature.name)} *a{i}"
                  for i, (_, d, _) in enumerate(signature.params)]
        params += [f"{c_type(d, signature.name)} *a{len(signature.params) + k}"
                   for k, (d, _) in enumerate(signature.results)]
        addresses = ", ".join([f"(void *)a{i}" for i in range(count)] + ["0"])
        lines += [f"int32_t {c_symbol(signature.name)}({', '.join(params) or 'void'}) {{",
                  f"  void *addresses[] = {{{addresses}}};",
                  f"  return tilegen_run(&tilegen_functions[{index}], addresses);", "}"]
    # Blocks the kernels keep between calls (a Python loader replaces these tables with
    # its own, which it frees; these live as long as the process).
    lines += ["__attribute__((constructor)) static void tilegen_start(void) {",
              f"  for (int i = 0; i < {len(signatures)}; i++) {{",
              "    const struct tilegen_function *f = &tilegen_functions[i];",
              "    if (*f->block_count > 0) *f->blocks = calloc((__SIZE_TYPE__)*f->block_count,"
              " sizeof(void *));",
              "  }", "}"] if signatures else []
    text = json.dumps(metadata, sort_keys=True)
    lines.append(f"const char tilegen_metadata[] __asm__({_c_string(METADATA)}) = "
                 f"{_c_string(text)};")
    return "\n".join(lines) + "\n"
