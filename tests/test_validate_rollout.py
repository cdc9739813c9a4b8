"""scripts/validate_rollout.py (Section 23), run as users run it: in a subprocess, with and
without --jit. The printed sequences are compared here again with the independent NumPy
rollout, the build folder must be gone afterwards, and --jit must write nothing at all."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from storylm import reference
from storylm.fixture import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "validate_rollout.py"
CHECKS = ("(a) ", "(b) ", "(c) ", "(d) causal non-leak, compiled", "(d) causal non-leak, NumPy",
          "(d) causal non-leak, PyTorch")


def run_script(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    # A private, empty TMPDIR: whatever the run writes to temporary storage lands there.
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, cwd=tmp, timeout=600)


def printed_ids(stdout: str, label: str) -> list[int]:
    match = re.search(rf"^{label}\s+(\[[0-9, ]+\])", stdout, re.M)
    assert match, f"no '{label}' line in:\n{stdout}"
    return ast.literal_eval(match.group(1))


@pytest.mark.parametrize("mode", ["so", "jit"])
def test_validate_rollout(mode, tmp_path):
    args = ("--jit",) if mode == "jit" else ()
    result = run_script(*args, tmp=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"validate_rollout: PASS \(\d+ passed, 0 failed", out)
    for check in CHECKS:
        # Table rows read `RESULT  check  detail`.
        line = next((ln for ln in out.splitlines() if ln[8:].startswith(check)), None)
        if line is None and "PyTorch" in check:
            continue  # torch not importable: the script reports SKIP under another name
        assert line is not None, f"missing check {check!r}:\n{out}"
        assert line.startswith("PASS  "), line
    assert "FAIL" not in out

    # The sequences agree with the NumPy rollout computed here from the fixture.
    checkpoint = load_checkpoint()
    prompt = [1, 4, 2, 6]
    assert printed_ids(out, "prompt") == prompt
    assert printed_ids(out, "greedy") == reference.rollout(prompt, checkpoint, mode="greedy")
    assert printed_ids(out, "sampled") == reference.rollout(prompt, checkpoint, mode="sample")
    assert '"once time upon end' in out  # decoded through vocab.json

    # The .so build folder is removed at exit; --jit writes nothing to disk at all.
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == [], f"{mode} run left files behind: {leftovers}"
    if mode == "so":
        assert ".so files in" in out


def test_bad_fixture_exits_2(tmp_path):
    (tmp_path / "manifest.json").write_text("{")
    result = run_script("--jit", "--fixture", str(tmp_path), tmp=tmp_path)
    assert result.returncode == 2
    assert "cannot load the fixture" in result.stderr
    assert "manifest.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_token_fails_the_run(capsys, monkeypatch):
    """The FAIL path: a greedy decoder that always answers 0 fails (b), exit status 1."""
    spec = importlib.util.spec_from_file_location("validate_rollout", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "validate_rollout", script)  # for its dataclasses
    spec.loader.exec_module(script)
    import tilegen

    module = tilegen.compile_file(script.ROLLOUT_EXAMPLE, jit=True)
    forward = tilegen.compile_file(script.FORWARD_EXAMPLE, jit=True)

    class AlwaysPad:
        storylm0_rollout = module.storylm0_rollout
        sample_row = module.sample_row

        @staticmethod
        def greedy_row(row, out):
            out[...] = 0
            return out

    checkpoint = load_checkpoint()
    status = script.validate(checkpoint, checkpoint.vocab, REPO / "fixtures" / "storylm0",
                             AlwaysPad, forward, "test", 0.0)
    out = capsys.readouterr().out
    assert status == 1
    line = next(ln for ln in out.splitlines() if ln[8:].startswith("(b) "))
    assert line.startswith("FAIL  ") and "first difference from NumPy at index 4" in line
    assert np.all([ln.count("FAIL") == 0 for ln in out.splitlines()
                   if ln[8:].startswith("(c) ")])
