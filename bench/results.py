"""Where benchmark runs are written by default: bench-results/ (git-ignored), one
`run-<UTC time>.json` per `pytest --benchmark-only` without --benchmark-json, with the
report's .md and .png next to it (`python bench/report.py` reads the newest)."""

from __future__ import annotations

import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench-results"


def new_run_path(folder: Path = RESULTS_DIR) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder / time.strftime("run-%Y%m%d-%H%M%S.json", time.gmtime())


def latest_run(folder: Path = RESULTS_DIR) -> Path | None:
    runs = sorted(folder.glob("run-*.json")) if folder.is_dir() else []
    return runs[-1] if runs else None
