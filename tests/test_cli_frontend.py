"""`python -m tilegen.compile` as a user runs it: the frontend stages and clean failures.

Each case is a real subprocess (sys.executable), run from a scratch directory so bare
example names must resolve against the bundled examples, not the working directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("storylm0_forward", "storylm0_nll_step", "storylm0_rollout")
LOCATION = re.compile(r"^(?P<file>.+\.kina):(?P<line>\d+):(?P<col>\d+): error\[K\d{3}\]: ",
                      re.MULTILINE)


def compile_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_clean_failure(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stderr.strip(), "the diagnostic goes to stderr"


@pytest.mark.parametrize("name", EXAMPLES)
def test_emit_types_for_each_example(name: str, tmp_path: Path) -> None:
    result = compile_cli(f"{name}.kina", "--emit", "types", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "shapes proved for every positive value of the constants" in out
    assert "const T = " in out and "// symbol: positive integer" in out
    assert re.search(r"proved \(\d+ obligations\):", out)
    assert "[reshape-count] reshape: Dh*H*T elements == Dh*H*T" in out
    match = re.search(r"// (\d+) obligations discharged symbolically; all shapes legal at "
                      r"T = (\d+)", out)
    assert match and int(match.group(1)) > 50
    assert match.group(2) == ("36" if name == "storylm0_rollout" else "4")
    # Each binding line: name, proved symbolic type, concrete shape, op, location.
    assert re.search(r"^  x\s+: f32\[1, T, D\]\s+= \[1, \d+, 4\]\s+gather\s+@\d+:\d+$", out,
                     re.MULTILINE)


def test_emit_tokens_ast_and_tensor(tmp_path: Path) -> None:
    result = compile_cli("storylm0_forward.kina", "--emit", "tokens", "--emit", "ast",
                         "--emit", "tensor", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # tokens: `line:col kind 'text'`
    assert "5:1 keyword 'const'\n5:7 ident 'T'\n5:9 punct '='\n5:11 int '4'\n" in out
    # ast: indented nodes with positions
    assert "Module @5:1\n  .consts\n    ConstDecl @5:1\n" in out
    assert "    FnDecl @12:1 attributes=() tuple_result=False\n" in out
    # tensor: the specialised IR, with source locations as comments
    assert "const T = 4\n" in out
    assert re.search(r"%x = gather\(%token_embedding, %token_ids\) : f32\[1, 4, 4\]  "
                     r"// .*storylm0_forward\.kina:25:11", out)
    assert "func @main() -> () attributes {main} {" in out
    # the stages come out in pipeline order
    assert out.index("5:1 keyword") < out.index("Module @5:1") < out.index("func @split_heads")


def test_default_summary_and_bare_name_without_extension(tmp_path: Path) -> None:
    result = compile_cli("storylm0_rollout", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"storylm0_rollout\.kina: 5 function\(s\), \d+ shape obligations proved",
                     result.stdout)
    assert "@main main() -> ()" in result.stdout
    # Derived consts are printed by name, as written (D, not Dh*H).
    assert "  split_heads(f32[1, T, D]) -> (f32[1, H, T, Dh])\n" in result.stdout


def test_a_local_file_wins_over_nothing_and_paths_work(tmp_path: Path) -> None:
    program = tmp_path / "tiny.kina"
    program.write_text("fn f(x: Tensor[F32, [2], @host]) -> Tensor[F32, [2], @host] {\n"
                       "  return x * 2.0;\n}\n")
    result = compile_cli("tiny.kina", "--emit", "tensor", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "%t1 = mul(%x, %t0) : f32[2]" in result.stdout


def test_bad_program_exits_1_with_a_located_diagnostic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.kina"
    bad.write_text("const T = 4;\n"
                   "fn f(x: Tensor[F32, [1, T, 4], @host]) -> Tensor[F32, [1, T, 3], @host] {\n"
                   "  return reshape(x, [1, T, 3]);\n}\n")
    result = compile_cli(str(bad), "--emit", "types", cwd=tmp_path)
    assert_clean_failure(result)
    match = LOCATION.search(result.stderr)
    assert match and (match["line"], match["col"]) == ("3", "21")
    assert match["file"].endswith("bad.kina")
    assert "   3 |   return reshape(x, [1, T, 3]);\n" in result.stderr
    assert "                        ^^^^^^^^^\n" in result.stderr
    assert "4*T elements" in result.stderr and "3*T" in result.stderr
    assert result.stdout == ""  # nothing half-printed for --emit types


def test_missing_file_exits_1_cleanly(tmp_path: Path) -> None:
    result = compile_cli(str(tmp_path / "nope.kina"), cwd=tmp_path)
    assert_clean_failure(result)
    assert "error[K600]: cannot read" in result.stderr and "No such file" in result.stderr


def test_directory_exits_1_cleanly(tmp_path: Path) -> None:
    result = compile_cli(str(tmp_path), cwd=tmp_path)
    assert_clean_failure(result)
    assert "error[K600]" in result.stderr and "is a directory" in result.stderr


def test_unreadable_path_under_a_file_exits_1_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = compile_cli(str(blocker / "inside.kina"), cwd=tmp_path)
    assert_clean_failure(result)
    assert "error[K600]: cannot read" in result.stderr


def test_non_utf8_file_exits_1_with_the_byte_located(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.kina"
    latin.write_bytes("const T = 4;\n// caf\u00e9\n".encode("latin-1"))
    result = compile_cli(str(latin), cwd=tmp_path)
    assert_clean_failure(result)
    match = LOCATION.search(result.stderr)
    assert match and (match["line"], match["col"]) == ("2", "7")
    assert "invalid UTF-8 byte 0xe9" in result.stderr


def test_version_and_help(tmp_path: Path) -> None:
    version = compile_cli("--version", cwd=tmp_path)
    assert version.returncode == 0
    assert re.fullmatch(r"tilegen \d+\.\d+\.\d+ \(Kina frontend\)\n", version.stdout)
    help_ = compile_cli("--help", cwd=tmp_path)
    assert help_.returncode == 0
    for word in ("--emit", "tokens", "ast", "types", "tensor", "bundled examples"):
        assert word in help_.stdout


def test_unknown_stage_is_a_usage_error(tmp_path: Path) -> None:
    result = compile_cli("storylm0_forward.kina", "--emit", "bytecode", cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid choice: 'bytecode'" in result.stderr
    assert "Traceback" not in result.stderr
