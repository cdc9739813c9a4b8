"""The README's and the docs' samples are real: their programs run as written and their
printed outputs are what the commands print (times and the CPU name aside)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markdown import fenced_blocks

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENV.pop("TILEGEN_CACHE_DIR", None)


def _pattern(documented: str) -> re.Pattern:
    """A documented output line as a regex: `...` stands for anything, a parenthesised
    time for any time, `JIT-compiled for <cpu>` for any CPU."""
    text = re.sub(r"\(\d+(?:\.\d+)? (?:ns|us|ms|s)\)", "\0TIME\0", documented)
    text = re.sub(r"JIT-compiled for \S+", "JIT-compiled for \0CPU\0", text)
    escaped = re.escape(text).replace(r"\.\.\.", ".*")
    escaped = escaped.replace("\0TIME\0", r"\(\d+(?:\.\d+)? (?:ns|us|ms|s)\)")
    return re.compile(escaped.replace("\0CPU\0", r"\S+") + "$")


def _assert_same_output(documented: str, printed: str) -> None:
    want = documented.rstrip("\n").split("\n")
    got = printed.rstrip("\n").split("\n")
    assert len(want) == len(got), f"documented:\n{documented}\nprinted:\n{printed}"
    for line, actual in zip(want, got, strict=True):
        assert _pattern(line).match(actual), f"documented: {line}\nprinted:    {actual}"


def _cli(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_readme_main_job_output(tmp_path):
    (sample,) = [b for b in fenced_blocks(REPO / "README.md", "")
                 if "shape obligations proved" in b]
    _assert_same_output(sample, _cli("storylm0_forward.kina", cwd=tmp_path))


def test_kina_md_first_program_output(tmp_path):
    first = next(b for b in fenced_blocks(REPO / "docs" / "kina.md", "kina")
                 if "A first program" in b)
    (tmp_path / "first.kina").write_text(first)
    (sample,) = [b for b in fenced_blocks(REPO / "docs" / "kina.md", "")
                 if b.startswith("$ python -m tilegen.compile first.kina")]
    command, output = sample.split("\n", 1)
    _assert_same_output(output, _cli(*command.split()[4:], cwd=tmp_path))


def test_readme_python_snippet_runs_as_written(tmp_path, monkeypatch):
    (code,) = [b for b in fenced_blocks(REPO / "README.md", "python")
               if "tilegen.compile_file" in b]
    monkeypatch.chdir(tmp_path)  # from any folder
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    logits, token = namespace["logits"], namespace["token"]
    assert logits.shape == (1, 36, 8) and token.tolist() == [[int(logits[0, 3].argmax())]]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_aot_md_c_example_builds_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    doc = REPO / "docs" / "aot.md"
    (program,) = fenced_blocks(doc, "kina")
    (main,) = fenced_blocks(doc, "c")
    (tmp_path / "prog.kina").write_text(program)
    (tmp_path / "main.c").write_text(main)
    (commands,) = [b for b in fenced_blocks(doc, "bash") if "main.c" in b]
    for command in commands.strip().split("\n"):
        result = subprocess.run(command.replace("python ", f"{sys.executable} ", 1), shell=True,
                                cwd=tmp_path, capture_output=True, text=True, timeout=600,
                                env=ENV)
        assert result.returncode == 0, f"{command}: {result.stderr}"
    (printed,) = fenced_blocks(doc, "text")
    assert result.stdout == printed
    declared = next(b for b in fenced_blocks(doc, "") if "int32_t kina_embed_softmax" in b)
    assert declared.strip() in (tmp_path / "prog.h").read_text()
    (code,) = [b for b in fenced_blocks(doc, "python") if "load_library" in b]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "aot.md", "exec"), namespace)
    assert namespace["sums"].round(2).tolist() == [[2.5, 2.5, 1.0, 4.0]]
