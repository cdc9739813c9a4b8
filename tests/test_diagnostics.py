"""Every diagnostic points at a place: exact line, column, kind/code and an actionable message.

The table is the catalogue of bad programs. Each case names the error kind and its stable
code (docs/errors.md), the 1-based line and column of the caret, a fragment of the message
and, where the note carries the fix, a fragment of a note. Positions were worked out by
hand from the source text, not copied from the compiler's output.
"""

from __future__ import annotations

import random
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import (
    KinaError,
    Source,
    check_source,
    decode_source,
    load_program,
    load_source,
    specialize,
)
from kina_frontend.lexer import tokenize
from kina_frontend.parser import MAX_NESTING

# The codes are part of the user-facing contract; spelled out here, not read from the module.
CODES = {"lex": "K100", "syntax": "K200", "name": "K300", "arity": "K310", "type": "K400",
         "shape": "K410", "unsupported": "K500", "io": "K600", "autodiff": "K700",
         "lowering": "K800"}

# A two-line prelude most cases share; the error then sits on line 3.
F23 = "Tensor[F32, [2, 3], @host]"
PRELUDE = f"const T = 4;\nfn f(x: {F23}, i: Tensor[I64, [2, 3], @host]) -> {F23} {{\n"


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    kind: str
    line: int
    column: int
    fragment: str
    note: str | None = None


def body(*lines: str) -> str:
    """PRELUDE + the given body lines + the closing brace; body line k is source line k + 2."""
    return PRELUDE + "".join(f"  {line}\n" for line in lines) + "}\n"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


CASES = [
    # ---- lexical (K100) -----------------------------------------------------------------------
    Case("bad-char", body("return x $ x;"), "lex", 3, 12, "unexpected character '$'"),
    Case("non-ascii-ident", body("let é = x;"), "lex", 3, 7, "unexpected character 'é'"),
    Case("control-char", body("let y = x;\x07"), "lex", 3, 13, "U+0007"),
    Case("unterminated-block-comment", "const T = 4;\n  /* never closed\nfn f() {}\n", "lex",
         2, 3, "unterminated block comment", "closed by '*/'"),
    Case("malformed-number-suffix", "const T = 12abc;\n", "lex", 1, 11,
         "malformed number '12abc'"),
    Case("malformed-number-two-dots", body("return x * 1.2.3;"), "lex", 3, 14,
         "malformed number '1.2.3'"),
    Case("malformed-number-exponent", body("return x * 1.5e;"), "lex", 3, 14,
         "malformed number '1.5e'"),
    Case("float-out-of-f32-range", body("return x * 1e39;"), "lex", 3, 14,
         "float literal 1e39 is out of the F32 range", "3.4028235e38"),
    Case("int-out-of-i64-range", body("return i + 9223372036854775808;"), "lex", 3, 14,
         "out of the I64 range", "9223372036854775807"),
    # ---- syntax (K200) ------------------------------------------------------------------------
    # A forgotten ';' is reported just after the last token of its line.
    Case("missing-semicolon", body("let y = x", "return y;"), "syntax", 3, 12,
         "expected ';' after a 'let' binding, found 'return'"),
    Case("missing-semicolon-same-line", body("let y = x return y;"), "syntax", 3, 13,
         "expected ';' after a 'let' binding"),
    Case("missing-close-paren", body("return exp(x;"), "syntax", 3, 15,
         "expected ',' or ')' after an argument, found ';'", "opened at t.kina:3:13"),
    Case("unclosed-parenthesis", body("return (x + x;"), "syntax", 3, 16,
         "expected ')' to close the parenthesis"),
    Case("dims-not-a-list", "fn f(x: Tensor[F32, 2, @host]) {}\n", "syntax", 1, 21,
         "expected '[' to open the dimension list, found number 2"),
    Case("placement-without-at", "fn f(x: Tensor[F32, [2], host]) {}\n", "syntax", 1, 26,
         "expected '@' before the placement"),
    Case("type-not-tensor", "fn f(x: Array[F32, [2], @host]) {}\n", "syntax", 1, 9,
         "expected a type 'Tensor[DTYPE, [dims], @placement]', found name 'Array'"),
    Case("missing-arrow", f"fn f(x: {F23}) {F23} {{ return x; }}\n", "syntax", 1, 37,
         "expected '->' before the result type", "fn f(...) -> Tensor[...]"),
    Case("parameter-without-type", "fn f(x) {}\n", "syntax", 1, 7,
         "expected ':' after parameter 'x' (every parameter needs a type)"),
    Case("statement-after-return", body("return x;", "let y = x;"), "syntax", 4, 3,
         "statement after 'return' is unreachable"),
    Case("keyword-as-name", body("let return = x;", "return x;"), "syntax", 3, 7,
         "expected a name after 'let', found 'return'", "'return' is a reserved word"),
    Case("keyword-as-fn-name", "fn let() {}\n", "syntax", 1, 4,
         "expected a name after 'fn', found 'let'"),
    Case("positional-after-keyword", body("return softmax(axis=1, x);"), "syntax", 3, 26,
         "positional argument after a keyword argument", "come last"),
    Case("unclosed-body-at-eof", PRELUDE + "  let y = x;\n", "syntax", 3, 13,
         "unexpected end of file inside a function body; missing '}'", "opened at t.kina:2:"),
    Case("annotated-tuple-let", body(f"let (a, b): {F23} = (x, x);", "return a;"), "syntax",
         3, 13, "a type annotation needs a single name", "in its own 'let'"),
    Case("top-level-statement", "let x = 1;\n", "syntax", 1, 1,
         "expected 'const' or 'fn' at top level, found 'let'"),
    Case("expression-expected", body("return );"), "syntax", 3, 10,
         "expected an expression, found ')'"),
    Case("call-of-a-number", body("return 1(x);"), "syntax", 3, 10, "only names can be called"),
    Case("reverse-mode-not-called", body("return reverseMode(f, wrt=[x]);"), "syntax", 3, 10,
         "call it with f's arguments"),
    Case("too-deeply-nested", body("return " + "exp(" * (MAX_NESTING + 1) + "x"
                                   + ")" * (MAX_NESTING + 1) + ";"),
         "syntax", 3, 10 + 4 * MAX_NESTING, f"nested more than {MAX_NESTING} levels deep"),
    # ---- names (K300) -------------------------------------------------------------------------
    Case("unknown-name-did-you-mean", src(f"""
        fn f(hidden: {F23}) -> {F23} {{
          return exp(hiden);
        }}"""), "name", 2, 14, "unknown name 'hiden'", "did you mean 'hidden'?"),
    Case("unknown-op", body("return softmx(x, axis=1);"), "name", 3, 10,
         "unknown op or function 'softmx'", "did you mean 'softmax'?"),
    Case("unknown-const-in-dim", "const T = 4;\nfn f(x: Tensor[F32, [1, Q], @host]) {}\n", "name",
         2, 25, "unknown const 'Q' in a dimension"),
    Case("unknown-const-did-you-mean",
         "const Tokens = 4;\nfn f(x: Tensor[F32, [Token], @host]) {}\n", "name", 2, 22,
         "unknown const 'Token'", "did you mean 'Tokens'?"),
    Case("duplicate-function", src(f"""
        fn g(x: {F23}) -> {F23} {{ return x; }}
        fn g(x: {F23}) -> {F23} {{ return x; }}"""), "name", 2, 4,
         "function 'g' is defined twice", "first defined at t.kina:1:4"),
    Case("duplicate-const", "const T = 4;\nconst T = 5;\n", "name", 2, 7,
         "const 'T' is defined twice", "first defined at t.kina:1:7"),
    Case("duplicate-param", f"fn f(x: {F23}, x: {F23}) {{}}\n", "name", 1, 37,
         "parameter 'x' is declared twice", "first declared at t.kina:1:6"),
    Case("fn-named-like-op", f"fn softmax(x: {F23}) -> {F23} {{ return x; }}\n", "name", 1, 4,
         "function 'softmax' clashes with the built-in op"),
    Case("const-named-like-op", "const sum = 3;\n", "name", 1, 7,
         "const 'sum' clashes with the op"),
    Case("unknown-attribute", "@inline\nfn f() {}\n", "name", 1, 2,
         "unknown attribute '@inline'", "the only function attribute is @main"),
    Case("two-mains", "@main\nfn a() {}\n@main\nfn b() {}\n", "name", 4, 4,
         "more than one @main function", "the first is 'a' at t.kina:2:4"),
    Case("let-rebinds-op", body("let exp = x;", "return x;"), "name", 3, 7,
         "'exp' is an op or function name and cannot be rebound"),
    Case("let-rebinds-const", body("let T = x;", "return x;"), "name", 3, 7,
         "'T' is a const and cannot be rebound"),
    Case("tuple-let-binds-twice", body("let (a, a) = (x, x);", "return a;"), "name", 3, 11,
         "'a' is bound twice in this 'let'"),
    Case("param-named-like-const", f"const T = 2;\nfn f(T: {F23}) {{}}\n", "name", 2, 6,
         "parameter 'T' has the name of a const"),
    # ---- arity (K310) -------------------------------------------------------------------------
    Case("op-too-many-args", body("return exp(x, x);"), "arity", 3, 17,
         "'exp' takes at most 1 positional argument(s), got 2", "signature: exp(x: tensor)"),
    Case("op-missing-arg", body("return add(x);"), "arity", 3, 10,
         "'add' is missing argument 'rhs'"),
    Case("op-missing-axis", body("return softmax(x);"), "arity", 3, 10,
         "'softmax' is missing argument 'axis'", "softmax(x: tensor, axis: int)"),
    Case("fn-wrong-arg-count", src(f"""
        fn g(x: {F23}) -> {F23} {{ return x; }}
        fn f(x: {F23}) -> {F23} {{
          return g(x, x);
        }}"""), "arity", 3, 10, "'g' takes 1 argument(s), got 2", "'g' is declared at t.kina:1:4"),
    Case("fn-keyword-arg", src(f"""
        fn g(x: {F23}) -> {F23} {{ return x; }}
        fn f(x: {F23}) -> {F23} {{
          return g(x=x);
        }}"""), "arity", 3, 12, "function 'g' takes positional arguments only"),
    Case("unknown-kwarg", body("return softmax(x, axs=1);"), "arity", 3, 21,
         "'softmax' has no argument named 'axs'"),
    Case("duplicate-kwarg", body("return softmax(x, axis=1, axis=0);"), "arity", 3, 29,
         "argument 'axis' of 'softmax' is given twice"),
    Case("tuple-let-count", body("let (a, b) = exp(x);", "return a;"), "arity", 3, 3,
         "'let' binds 2 name(s) but the value has 1 result(s)"),
    Case("single-let-of-tuple", src(f"""
        fn g(x: {F23}) -> ({F23}, {F23}) {{ return (x, x); }}
        fn f(x: {F23}) -> {F23} {{
          let y = g(x);
          return y;
        }}"""), "arity", 3, 3, "'let' binds 1 name(s) but the value has 2 result(s)"),
    Case("return-count", body("return (x, x);"), "arity", 3, 3,
         "'return' gives 2 value(s) but 'f' declares 1 result(s)"),
    Case("placeholder-form", "@main\nfn m() {\n  let a = placeholder(1);\n}\n", "arity", 3, 11,
         "placeholder takes one tensor type"),
    Case("reverse-mode-callable-arg-count", src(f"""
        fn loss(x: {F23}) -> Tensor[F32, [], @host] {{ return sum(sum(x, axis=1), axis=0); }}
        fn f(x: {F23}) -> {F23} {{
          let (l, g) = reverseMode(loss, wrt=[x])(x, x);
          return g;
        }}"""), "arity", 3, 16, "reverseMode(loss) takes 1 argument(s), got 2"),
    # ---- types (K400) -------------------------------------------------------------------------
    Case("exp-of-i64", body("let y = exp(i);", "return x;"), "type", 3, 15,
         "'exp' needs a floating-point operand, got I64"),
    Case("float-literal-with-i64", body("let j = i * 0.5;", "return x;"), "type", 3, 15,
         "float literal 0.5 used with an I64 tensor", "write an integer"),
    Case("dtype-mismatch-add", body("return add(x, i);"), "type", 3, 17,
         "'add' operands have different element types: F32 and I64"),
    Case("div-of-i64", body("let j = i / 2;", "return x;"), "type", 3, 11,
         "'div' needs floating-point operands, got I64"),
    Case("gather-ids-f32", src("""
        fn f(table: Tensor[F32, [8, 4], @host], ids: Tensor[F32, [1, 3], @host])
            -> Tensor[F32, [1, 3, 4], @host] {
          return gather(table, ids);
        }"""), "type", 3, 24, "'gather' ids must be I64, got F32"),
    Case("return-dtype-mismatch", src(f"""
        fn f(x: {F23}) -> Tensor[I64, [2, 3], @host] {{
          return x;
        }}"""), "type", 2, 10,
         "result 0 of 'f': expected Tensor[I64, [2, 3], @host], got Tensor[F32, [2, 3], @host]",
         "declared at t.kina:1:"),
    Case("missing-return", f"fn f(x: {F23}) -> {F23} {{\n  let y = exp(x);\n}}\n", "type", 1, 4,
         "function 'f' declares a result but has no 'return'"),
    # ---- the transformer ops ---------------------------------------------------------------
    Case("where-float-cond", body("return where(x, x, 0.0);"), "type", 3, 16,
         "'where' condition must be BOOL, got F32", "comparisons (less, equal, ...)"),
    Case("less-on-bool", body("let m = less(x, 0.0);", "return where(less(m, m), x, x);"),
         "type", 4, 21, "'less' orders numbers; BOOL operands only take equal and not_equal"),
    Case("cast-identity", body("let j = cast(i, I64);", "return x;"), "type", 3, 19,
         "'cast' from I64 to I64 is the identity"),
    Case("cast-not-a-type", body("return cast(x, F8);"), "type", 3, 18,
         "'cast' expects an element type: F32, F64, I64, BF16, BOOL"),
    Case("pow-tensor-exponent", body("return pow(x, x);"), "type", 3, 17,
         "'pow' expects a number (a literal or a const)"),
    Case("slice-past-end", body("let s = slice(x, axis=1, start=2, size=T - 2);", "return x;"),
         "shape", 3, 42, "'slice' takes [2, T) along axis 1 of f32[2, 3], past its 3 elements"),
    Case("layer-norm-gamma", body("return layer_norm(x, sum(x, axis=1), sum(x, axis=0), "
                                  "axis=1);"), "shape", 3, 24,
         "'layer_norm' gamma has 2 elements, the normalised axis 1 of f32[2, 3] has 3"),
    Case("concat-mismatch", body("return concat(x, transpose(x, [1, 0]), axis=0);"), "shape",
         3, 10, "'concat' operand 1 f32[3, 2] differs from operand 0 f32[2, 3] at dim 1"),
    # A const is a number where an op takes one (add(x, T) is x + 4.0), not a tensor.
    Case("const-as-tensor", body("return add(exp(T), x);"), "type", 3, 18,
         "'T' is a const dimension, not a tensor"),
    Case("type-as-value", body(f"return add(x, {F23});"), "type", 3, 17,
         "a type is not a value here", "placeholder(Tensor[...])"),
    Case("function-as-value", body("return softmax;"), "type", 3, 10,
         "'softmax' is a function; call it with arguments"),
    Case("tensor-called", body("return x(x);"), "type", 3, 10, "'x' is a tensor, not a function"),
    Case("number-as-tensor", body("return 1.5;"), "type", 3, 10, "a number is not a tensor here"),
    Case("placeholder-outside-main", body(f"let p = placeholder({F23});", "return p;"), "type",
         3, 11, "placeholder(...) is only allowed in the @main function", "@main"),
    Case("main-called", src("""
        @main
        fn main() {
          let x = placeholder(Tensor[F32, [2], @host]);
        }
        fn f() {
          main();
        }"""), "type", 6, 3, "the @main function 'main' cannot be called"),
    Case("unknown-dtype", "fn f(x: Tensor[Q32, [2], @host]) {}\n", "type", 1, 16,
         "unknown element type 'Q32'"),
    Case("dims-attr-not-a-list", body("return broadcast(x, x);"), "type", 3, 23,
         "'broadcast' expects a list of dims like [1, T, 4]"),
    Case("axis-not-a-literal", body("return softmax(x, axis=x);"), "type", 3, 26,
         "expected an integer literal"),
    Case("annotation-dtype", body("let y: Tensor[I64, [2, 3], @host] = x;", "return y;"), "type",
         3, 10, "'y' is annotated: expected Tensor[I64, [2, 3], @host]"),
    # ---- shapes (K410) ------------------------------------------------------------------------
    Case("reshape-count", src("""
        const T = 4;
        fn f(x: Tensor[F32, [1, T, 4], @host]) -> Tensor[F32, [1, T, 3], @host] {
          return reshape(x, [1, T, 3]);
        }"""), "shape", 3, 21,
         "reshape changes the element count: f32[1, T, 4] has 4*T elements, [1, T, 3] has 3*T",
         "4*T - (3*T) simplifies to T, not 0"),
    Case("reshape-infer-not-divisible", body("return reshape(x, [-1, 4]);"), "shape", 3, 21,
         "reshape cannot infer the -1 dim: 6 elements are not a multiple of 4"),
    Case("reshape-two-inferred", body("return reshape(x, [-1, -1]);"), "shape", 3, 21,
         "reshape may infer at most one dim (-1)"),
    Case("matmul-inner", src(f"""
        fn f(a: {F23}, b: Tensor[F32, [4, 5], @host]) -> Tensor[F32, [2, 5], @host] {{
          return matmul(a, b);
        }}"""), "shape", 2, 20,
         "'matmul' inner dims differ: f32[2, 3] has 3 columns, f32[4, 5] has 4 rows"),
    Case("matmul-rank-mismatch", src("""
        fn f(a: Tensor[F32, [1, 2, 3], @host], b: Tensor[F32, [3, 5], @host]) {
          let c = matmul(a, b);
        }"""), "shape", 2, 21, "'matmul' operands have different ranks",
         "broadcast(w, [1, D, D])"),
    Case("matmul-rank-1", src("""
        fn f(a: Tensor[F32, [3], @host], b: Tensor[F32, [3], @host]) {
          let c = a @ b;
        }"""), "shape", 2, 11, "'matmul' operand a has rank 1; ranks 2 to 4 are supported"),
    Case("matmul-batch", src("""
        fn f(a: Tensor[F32, [2, 2, 3], @host], b: Tensor[F32, [3, 3, 5], @host]) {
          let c = matmul(a, b);
        }"""), "shape", 2, 21, "'matmul' batch dims differ at dim 0",
         "batch dims must be equal; broadcast explicitly"),
    Case("broadcast-incompatible", body("let y = broadcast(x, [2, 4]);", "return x;"), "shape",
         3, 24, "cannot broadcast f32[2, 3] to [2, 4]: source dim 1 is 3, target dim 1 is 4",
         "each source dim must be 1 or equal the target dim"),
    Case("broadcast-lowers-rank", body("let y = broadcast(x, [3]);", "return x;"), "shape",
         3, 24, "broadcast cannot lower the rank: f32[2, 3] to [3]"),
    Case("axis-out-of-range", body("return softmax(x, axis=2);"), "shape", 3, 26,
         "axis 2 is out of range for f32[2, 3] (rank 2)", "valid axes are -2..1"),
    Case("negative-axis-out-of-range", body("let y = sum(x, axis=-3);", "return x;"),
         "shape", 3, 23, "axis -3 is out of range"),
    Case("bad-permutation", body("let y = transpose(x, [0, 0]);", "return x;"), "shape", 3, 24,
         "transpose permutation [0, 0] is not a permutation of 0..1 for f32[2, 3]"),
    Case("elementwise-shape", src(f"""
        fn f(x: {F23}, y: Tensor[F32, [3, 2], @host]) -> {F23} {{
          return x + y;
        }}"""), "shape", 2, 14, "'add' operand shapes differ at dim 0: f32[2, 3] vs f32[3, 2]",
         "use broadcast(x, [dims])"),
    Case("elementwise-rank", src(f"""
        fn f(x: {F23}, y: Tensor[F32, [3], @host]) -> {F23} {{
          return x * y;
        }}"""), "shape", 2, 14, "'mul' operands have different ranks"),
    # `const T = 4` and a literal 4 agree today but not for every T: the note says so.
    Case("symbolic-vs-concrete", src("""
        const T = 4;
        fn f(x: Tensor[F32, [1, T], @host], y: Tensor[F32, [1, 4], @host]) {
          let z = add(x, y);
        }"""), "shape", 3, 18, "'add' operand shapes differ at dim 1: f32[1, T] vs f32[1, 4]",
         "equal for the current values (4), but not for every value of the constants"),
    Case("return-shape", src("""
        const T = 4;
        fn f(x: Tensor[F32, [T, 2], @host]) -> Tensor[F32, [2, T], @host] {
          return x;
        }"""), "shape", 3, 10,
         "result 0 of 'f': expected Tensor[F32, [2, T], @host], got Tensor[F32, [T, 2], @host]",
         "T - (2) simplifies to T-2"),
    Case("const-not-positive", "const H = 2;\nconst T = H - 2;\n", "shape", 2, 11,
         "const 'T' must be a positive integer, got 0"),
    Case("dim-division", "fn f(x: Tensor[F32, [4 / 2], @host]) {}\n", "shape", 1, 22,
         "'/' is not allowed in a dimension", "+ - *"),
    Case("reduce-rank-0", "fn f(x: Tensor[F32, [], @host]) {\n  let y = sum(x, axis=0);\n}\n",
         "shape", 2, 15, "'sum' needs a tensor of rank >= 1, got f32[]"),
    Case("gather-table-rank", body("let y = gather(broadcast(x, [1, 2, 3]), i);", "return x;"),
         "shape", 3, 18, "'gather' table must have rank 2 [rows, width], got f32[1, 2, 3]"),
    Case("type-too-large", "fn f(x: Tensor[F32, [65536, 65536, 65536], @host]) {}\n", "shape",
         1, 9, "the type Tensor[F32, [65536, 65536, 65536], @host] has 281474976710656 elements"),
    Case("one-hot-zero-classes", body("let y = one_hot(i, 0);", "return x;"), "shape", 3, 22,
         "dimension 0 = 0 is not positive"),
    # ---- unsupported (K500) -------------------------------------------------------------------
    Case("device-placement", "fn f(x: Tensor[F32, [2], @device]) {}\n", "unsupported", 1, 27,
         "placement '@device' is not supported", "use @host"),
    Case("f16", "fn f(x: Tensor[F16, [2], @host]) {}\n", "unsupported", 1, 16,
         "element type F16 is not supported yet"),
    Case("self-recursion", src(f"""
        fn f(x: {F23}) -> {F23} {{
          return f(x);
        }}"""), "unsupported", 2, 10, "recursive call to 'f'", "recursion is not supported"),
    Case("mutual-recursion", src(f"""
        fn f(x: {F23}) -> {F23} {{ return g(x); }}
        fn g(x: {F23}) -> {F23} {{ return f(x); }}"""), "unsupported", 2, 76,
         "recursive call to 'f'"),
    # ---- reverseMode (K300 / K700) ------------------------------------------------------------
    Case("reverse-mode-unknown-fn", src(f"""
        fn loss(x: {F23}) -> Tensor[F32, [], @host] {{ return sum(sum(x, axis=1), axis=0); }}
        fn f(x: {F23}) {{
          let (l, g) = reverseMode(los, wrt=[x])(x);
        }}"""), "name", 3, 28, "reverseMode of unknown function 'los'",
         "did you mean 'loss'?"),
    Case("reverse-mode-wrt-not-param", src(f"""
        fn loss(x: {F23}) -> Tensor[F32, [], @host] {{ return sum(sum(x, axis=1), axis=0); }}
        fn f(x: {F23}, w: {F23}) {{
          let (l, g) = reverseMode(loss, wrt=[w])(x);
        }}"""), "name", 3, 39, "wrt entry must name a parameter of 'loss'", "parameters: x"),
    Case("reverse-mode-wrt-i64", src(f"""
        fn loss(x: {F23}, i: Tensor[I64, [2], @host]) -> {F23} {{ return x; }}
        fn f(x: {F23}, i: Tensor[I64, [2], @host]) {{
          let (l, g) = reverseMode(loss, wrt=[i])(x, i);
        }}"""), "autodiff", 3, 39,
         "cannot differentiate with respect to 'i': it is Tensor[I64, [2], @host]",
         "only floating-point parameters have gradients"),
    Case("reverse-mode-two-results", src(f"""
        fn pair(x: {F23}) -> ({F23}, {F23}) {{ return (x, x); }}
        fn f(x: {F23}) {{
          let (a, b, g) = reverseMode(pair, wrt=[x])(x);
        }}"""), "autodiff", 3, 31, "reverseMode needs 'pair' to return one tensor; it returns 2"),
    Case("reverse-mode-integer-result", src(f"""
        fn pick(x: {F23}) -> Tensor[I64, [2], @host] {{ return argmax(x, axis=1); }}
        fn f(x: {F23}) {{
          let (a, g) = reverseMode(pick, wrt=[x])(x);
        }}"""), "autodiff", 3, 28, "reverseMode needs 'pick' to return a floating-point tensor"),
    Case("reverse-mode-wrt-twice", src(f"""
        fn loss(x: {F23}) -> {F23} {{ return x; }}
        fn f(x: {F23}) {{
          let (l, g, h) = reverseMode(loss, wrt=[x, x])(x);
        }}"""), "name", 3, 45, "'x' appears twice in wrt"),
]


def _render_check(error: KinaError, case: Case) -> None:
    """`file:line:col: error[CODE]: message`, the source line in a gutter, a caret under it."""
    rendered = str(error)
    lines = rendered.split("\n")
    assert lines[0].startswith(f"t.kina:{case.line}:{case.column}: error[{CODES[case.kind]}]: ")
    source_line = case.source.split("\n")[case.line - 1].replace("\t", " ")
    gutter = f"{case.line:>4} | "
    excerpt, caret = lines[1], lines[2]
    assert excerpt.startswith(gutter)
    assert set(caret.strip()) == {"^"}
    if len(source_line) <= 160:
        assert excerpt == gutter + source_line
        assert caret.index("^") == len(gutter) + case.column - 1
    else:  # long lines are shown as a window around the column
        assert excerpt[len(gutter):] in source_line
    # Whatever the window, the first caret sits under the first character of the span.
    under = excerpt[caret.index("^")] if caret.index("^") < len(excerpt) else ""
    assert under == source_line[case.column - 1: case.column] or case.column > len(source_line)
    for note_line in lines[3:]:
        assert note_line.startswith("  note: ")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_program_diagnostic(case: Case) -> None:
    with pytest.raises(KinaError) as info:
        specialize(check_source(Source("t.kina", case.source)))
    error = info.value
    assert (error.kind, error.code) == (case.kind, CODES[case.kind]), str(error)
    assert (error.line, error.column) == (case.line, case.column), str(error)
    assert case.fragment in error.message, str(error)
    if case.note is not None:
        assert any(case.note in note for note in error.notes), str(error)
    _render_check(error, case)


def test_catalogue_is_large_and_distinct() -> None:
    assert len(CASES) >= 45
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.source for c in CASES}) == len(CASES)
    # Every user-facing kind except io (no source) and lowering (backend) has cases here.
    assert {c.kind for c in CASES} >= set(CODES) - {"io", "lowering"}


# ---- the messages that carry sympy expressions ----------------------------------------------

def test_reshape_message_shows_both_counts_as_sympy_expressions() -> None:
    text = src("""
        const T = 4;
        const H = 2;
        fn f(x: Tensor[F32, [1, T, 4], @host]) {
          let y = reshape(x, [1, T, H, 3]);
        }""")
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    message = info.value.message
    # 4*T elements in, 3*H*T out: both printed in sympy's syntax, neither substituted.
    assert "has 4*T elements" in message
    assert "has 3*H*T" in message
    assert "16" not in message and "24" not in message


def test_symbolic_vs_concrete_note_suggests_the_const() -> None:
    case = next(c for c in CASES if c.id == "symbolic-vs-concrete")
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", case.source))
    notes = "\n".join(info.value.notes)
    assert "T - (4) simplifies to T-4, not 0" in notes
    assert "write T instead of the literal 4" in notes


def test_two_consts_with_equal_values_are_still_different() -> None:
    text = src("""
        const T = 4;
        const U = 4;
        fn f(x: Tensor[F32, [T], @host], y: Tensor[F32, [U], @host]) {
          let z = x - y;
        }""")
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    assert info.value.kind == "shape"
    assert any("define one const in terms of the other" in n for n in info.value.notes)


# ---- decoding and reading (K100 / K600) -----------------------------------------------------

def test_non_utf8_bytes_point_at_the_byte() -> None:
    with pytest.raises(KinaError) as info:
        decode_source("bad.kina", b"const T = 4;\nconst \xff = 2;\n")
    error = info.value
    assert (error.kind, error.code, error.line, error.column) == ("lex", "K100", 2, 7)
    assert "invalid UTF-8 byte 0xff" in error.message
    assert str(error).startswith("bad.kina:2:7: error[K100]")


def test_non_utf8_after_multibyte_characters_counts_characters() -> None:
    # 'é' is two bytes but one column; the bad byte is the 4th character of line 1.
    with pytest.raises(KinaError) as info:
        decode_source("bad.kina", "// é".encode() + b"\xc3(")
    assert (info.value.line, info.value.column) == (1, 5)


def test_nul_byte() -> None:
    with pytest.raises(KinaError) as info:
        decode_source("nul.kina", b"const T = 4;\nconst\x00 U = 2;\n")
    error = info.value
    assert (error.kind, error.line, error.column) == ("lex", 2, 6)
    assert "NUL byte" in error.message


def test_io_errors_have_no_location(tmp_path) -> None:
    for path, fragment in ((tmp_path / "missing.kina", "No such file"),
                           (tmp_path, "is a directory")):
        with pytest.raises(KinaError) as info:
            load_source(path)
        assert (info.value.kind, info.value.code) == ("io", "K600")
        assert fragment in info.value.message
        assert info.value.line is None
        assert str(info.value).startswith("error[K600]: ")


def test_crlf_source_excerpt_has_no_carriage_return() -> None:
    text = f"fn f(x: {F23}) -> {F23} {{\r\n  return y;\r\n}}\r\n"
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    assert (info.value.line, info.value.column) == (2, 10)
    assert "\r" not in str(info.value)


def test_long_line_excerpt_keeps_the_caret_under_the_error() -> None:
    text = f"fn f(x: {F23}) -> {F23} {{ " + "let a = x; " * 30 + "return y; }\n"
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    error = info.value
    _, source_line, caret = str(error).split("\n")[:3]
    position = caret.index("^")
    assert source_line[position] == "y"
    assert len(source_line) < 200


# ---- robustness: no input escapes as anything but a KinaError -------------------------------

_EXAMPLE = src("""
    const T = 4;
    const D = 2 * T;
    fn g(x: Tensor[F32, [1, T, 4], @host], ids: Tensor[I64, [1, T], @host],
         w: Tensor[F32, [4, D], @host])
        -> (Tensor[F32, [1, T, D], @host], Tensor[I64, [1, T], @host]) {
      let h = matmul(x, broadcast(w, [1, 4, D])) * 0.5;
      let s = softmax(reshape(h, [1, T, 2, -1]), axis=-1);
      return (reshape(transpose(s, [0, 1, 3, 2]), [1, T, D]), argmax(-h + 1.0, axis=2));
    }
    fn loss(w: Tensor[F32, [4, D], @host]) -> Tensor[F32, [], @host] {
      return sum(sum(w, axis=1), axis=0);
    }
    @main
    fn main() {
      let x = placeholder(Tensor[F32, [1, T, 4], @host]);
      let ids = placeholder(Tensor[I64, [1, T], @host]);
      let w = placeholder(Tensor[F32, [4, D], @host]);
      let (y, a) = g(x, ids, w);
      let (l, dw) = reverseMode(loss, wrt=[w])(w);
      let o = one_hot(ids, 4) @ broadcast(w, [1, 4, D]);
    }""")
_TOKENS = [t for t in tokenize(Source("x", _EXAMPLE)) if t.kind != "eof"]
_PIECES = ["(", ")", "[", "]", ",", ";", "-1", "0", "3", "2.5", "T", "D", "x", "axis=", "@",
           "->", "fn", "let", "return", "Tensor", "I64", "F32", "-", "*", "+", "/", "{", "}",
           "reverseMode", "wrt=", "99999999999", "1e40", "/*", "[]", "placeholder", "main",
           "Tensor[F32, [], @host]", "é", "\x00", "1.2.3", "(x, x)"]


def test_the_fuzz_base_program_is_valid() -> None:
    specialize(check_source(Source("base.kina", _EXAMPLE)))


def _mutate(text: str, rng: random.Random, edits: int) -> str:
    """Delete, replace or insert tokens; half the replacements keep the token's kind
    (a name for a name, a number for a number) so the mutant usually parses and the
    checker, not only the parser, sees it."""
    same_kind = {kind: [t.text for t in _TOKENS if t.kind == kind] for kind in ("ident", "int")}
    for _ in range(edits):
        try:
            tokens = [t for t in tokenize(Source("x", text)) if t.kind != "eof"]
        except KinaError:
            break
        action = rng.randrange(10)
        if action < 6:  # same kind: usually still parses
            token = rng.choice([t for t in tokens if t.kind in same_kind])
            replacement = rng.choice(same_kind[token.kind])
        else:
            token = rng.choice(tokens)
            replacement = "" if action == 6 else rng.choice(_PIECES) + " " * (action == 9)
        start, end = token.span.start, token.span.end
        if action == 9:
            end = start  # insert before the token
        text = text[:start] + replacement + text[end:]
    return text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_mutated_programs_fail_only_with_kina_errors(seed: int, edits: int) -> None:
    text = _mutate(_EXAMPLE, random.Random(seed), edits)
    try:
        specialize(check_source(Source("fuzz.kina", text)))
    except KinaError as error:
        rendered = str(error)
        assert "error[K" in rendered
        if error.span is not None:
            assert rendered.startswith(f"fuzz.kina:{error.line}:{error.column}: ")


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_fail_only_with_kina_errors(data: bytes) -> None:
    try:
        specialize(check_source(decode_source("bytes.kina", data)))
    except KinaError as error:
        assert error.code in CODES.values()


def test_long_operator_chain_is_a_diagnostic_not_a_recursion_error() -> None:
    text = body("return " + " + ".join(["x"] * (MAX_NESTING + 5)) + ";")
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    assert info.value.kind == "syntax"
    chain = body("return " + " + ".join(["x"] * (MAX_NESTING - 5)) + ";")
    check_source(Source("t.kina", chain))  # just under the limit: fine


def test_huge_integer_literal_is_a_diagnostic() -> None:
    text = body("return reshape(x, [1" + "0" * 5000 + "]);")
    with pytest.raises(KinaError) as info:
        check_source(Source("t.kina", text))
    assert info.value.kind == "lex"
    assert "5001 digits" in info.value.message


# ---- docs/errors.md shows real output -------------------------------------------------------

ERRORS_MD = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def _documented_examples() -> list[tuple[str, str, str]]:
    """(file name, source, expected output) for each `// NAME.kina` example in errors.md."""
    blocks = re.findall(r"```(\w+)\n(.*?)```", ERRORS_MD.read_text(), re.DOTALL)
    examples = []
    for (lang, text), (next_lang, output) in zip(blocks, blocks[1:], strict=False):
        first = text.split("\n", 1)[0]
        if lang == "kina" and first.startswith("// ") and first.endswith(".kina"):
            name = first[3:]
            assert next_lang == "text", name
            command, expected = output.split("\n", 1)
            assert command == f"$ python -m tilegen.compile {name}"
            examples.append((name, text, expected.rstrip("\n")))
    return examples


def test_errors_md_documents_every_code_with_a_checked_example() -> None:
    examples = _documented_examples()
    assert {re.search(r"error\[(K\d+)\]", e[2]).group(1) for e in examples} == \
        set(CODES.values()) - {"K600", "K800"}
    for name, text, expected in examples:
        with pytest.raises(KinaError) as info:
            specialize(check_source(Source(name, text)))
        assert str(info.value) == expected, name


def test_errors_md_io_and_lowering_examples(tmp_path, monkeypatch) -> None:
    doc = ERRORS_MD.read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not_a_file.kina").mkdir()
    for path in ("not_a_file.kina", "missing.kina"):
        with pytest.raises(KinaError) as info:
            load_source(path)
        assert f"\n{info.value}\n" in doc
    calls = re.search(r"where `calls.kina` is\n\n```kina\n(.*?)```", doc, re.DOTALL).group(1)
    (tmp_path / "calls.kina").write_text(calls)
    from tilegen.lower import lower_function  # the backend raises K800

    program = specialize(load_program("calls.kina"))
    with pytest.raises(KinaError) as info:
        lower_function(program.function("f"))
    assert info.value.code == "K800"
    assert f"```text\n{info.value}\n```" in doc
