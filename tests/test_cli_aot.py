"""The CLI's small promises (issue 18): it names itself `tilegen` when installed as that,
honours TILEGEN_CACHE_DIR like the API, reports --run's compile and run time apart, and
writes .so/.o/.a libraries with their header."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilegen.compile import build_parser
from tilegen.run_inputs import format_seconds

REPO = Path(__file__).resolve().parent.parent


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_help_names_the_command_it_was_run_as(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/tilegen", "--help"])
    assert build_parser().format_usage().startswith("usage: tilegen ")
    monkeypatch.setattr(sys, "argv", [str(REPO / "tilegen" / "compile.py")])
    assert build_parser().format_usage().startswith("usage: python -m tilegen.compile ")


def test_cli_honours_the_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    first = _cli("storylm0_forward.kina", env={"TILEGEN_CACHE_DIR": str(cache)})
    assert first.returncode == 0, first.stderr
    assert f"disk cache {cache}" in first.stdout
    entries = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert "plans.pickle" in entries and any(name.endswith(".o") for name in entries)
    stamps = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    second = _cli("storylm0_forward.kina", env={"TILEGEN_CACHE_DIR": str(cache)})
    assert second.returncode == 0 and second.stdout.count("\n") == first.stdout.count("\n")
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == stamps


def test_run_reports_compile_and_run_time_apart():
    result = _cli("storylm0_forward.kina", "--run")
    assert result.returncode == 0, result.stderr
    unit = r"\d+(?:\.\d+)? (?:ns|us|ms|s)"
    assert re.search(rf"^ran @main with 9 placeholder\(s\) \(seed 0\): compiled in {unit}, "
                     rf"ran in {unit}$", result.stdout, re.M), result.stdout


@pytest.mark.parametrize("seconds, text", [(3e-7, "300 ns"), (1.234e-5, "12.3 us"),
                                           (0.0456, "45.6 ms"), (1.25, "1.25 s"),
                                           (0.0, "0 ns")])
def test_durations_read_in_their_unit(seconds, text):
    assert format_seconds(seconds) == text


def test_libraries_of_every_kind_with_their_header(tmp_path):
    for output in ("libf.so", "f.o", "libf.a"):
        result = _cli("storylm0_forward.kina", "-o", output, "--header", "f.h", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"wrote {output} and f.h (3 function(s), ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.h", "f.o", "libf.a", "libf.so"]
    assert "int32_t kina_storylm0_forward(" in (tmp_path / "f.h").read_text()
    bad = _cli("storylm0_forward.kina", "-o", "f.dll", cwd=tmp_path)
    assert bad.returncode == 1 and "name a .so (shared library), .o (object) or .a" in bad.stderr
    lonely = _cli("storylm0_forward.kina", "--header", "f.h", cwd=tmp_path)
    assert lonely.returncode == 1 and "--header needs -o" in lonely.stderr
