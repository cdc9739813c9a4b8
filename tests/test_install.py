"""A real install: the wheel ships the examples, the fixture and the validation scripts, so
an installed tilegen works from any folder (issue 18). Builds the wheel from a copy of the
source tree and installs it into a fresh virtual environment that sees this one's packages
(no download: --no-deps --no-build-isolation); about half a minute, marked `slow`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SKIPPED = shutil.ignore_patterns(".git", "__pycache__", "build", "dist", "*.egg-info",
                                 ".hypothesis", ".benchmarks", ".pytest_cache", "*.so", "*.o")


def _run(command, cwd, env):
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True,
                            text=True, timeout=900, env=env)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_from_any_folder(tmp_path):
    pytest.importorskip("setuptools")
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=SKIPPED)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "TILEGEN_CACHE_DIR")}
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
          "-q", "-w", tmp_path / "wheels"], source, env)
    (wheel,) = (tmp_path / "wheels").glob("tilegen-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv],
         tmp_path, env)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    _run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", wheel],
         tmp_path, env)
    shutil.rmtree(source)  # nothing may come from the source tree any more
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = _run([python, "-c", "import tilegen, kina_frontend, storylm.fixture as f; "
                    "print(tilegen.__file__, kina_frontend.EXAMPLES_DIR, "
                    "f.DEFAULT_FIXTURE_DIR, sep='\\n')"], elsewhere, env).split()
    assert all(path.startswith(str(venv)) for path in located), located
    main_job = _run([python, "-m", "tilegen.compile", "storylm0_forward.kina"], elsewhere, env)
    assert "3 function(s), 89 shape obligations proved" in main_job
    assert "JIT-compiled for" in main_job
    assert _run([bin_dir / "tilegen", "--help"], elsewhere, env).startswith("usage: tilegen ")
    library = _run([bin_dir / "tilegen", "storylm0_rollout", "-o", "rollout.so", "--header",
                    "rollout.h"], elsewhere, env)
    assert library.startswith("wrote rollout.so and rollout.h")
    rollout = _run([bin_dir / "tilegen-validate-rollout", "--jit"], elsewhere, env)
    assert "validate_rollout: PASS" in rollout
    assert sorted(p.name for p in elsewhere.iterdir()) == ["rollout.h", "rollout.so"]
