"""The validation scripts as commands: `tilegen-validate-rollout`, `tilegen-validate-train`.

They run scripts/validate_rollout.py and scripts/validate_train.py -- from the source
checkout, or from the copy an installed tilegen ships (tilegen/scripts) -- with the
command's arguments.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def script(name: str) -> Path:
    for folder in (_ROOT / "scripts", _ROOT / "tilegen" / "scripts"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{name} is neither in {_ROOT / 'scripts'} nor in the installed "
                            f"package ({_ROOT / 'tilegen' / 'scripts'})")


def _run(name: str) -> None:
    path = script(name)
    sys.argv[0] = str(path)
    runpy.run_path(str(path), run_name="__main__")


def rollout() -> None:
    _run("validate_rollout.py")


def train() -> None:
    _run("validate_train.py")
