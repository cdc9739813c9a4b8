"""Repository-wide pytest settings.

Plain `pytest` runs every benchmark in bench/ once, as a correctness test (pytest-benchmark's
short mode), so the test command stays quick; `pytest --benchmark-only` (or
`--benchmark-enable`) measures them.

A measured run without --benchmark-json writes bench-results/run-<time>.json (git-ignored);
`python bench/report.py` turns the newest into a table and a chart next to it.

Measured rounds last at least 200 us unless --benchmark-min-time gives another value.
pytest-benchmark's default of 5 us puts only 3 or 4 calls of a 1.5 us function in a round,
and the round's own timer reads and dispatch (~0.15 us per call, measured on B1) would be
counted as the function's time; at 200 us they are spread over a hundred calls or more.

Unless measuring, TILEGEN_VERIFY=1 is set (when unset) for the tests and the CLIs they run.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_MIN_TIME = "0.000005"  # pytest-benchmark's own default, as its option holds it
ROUND_MIN_TIME = "0.0002"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    measuring = config.getoption("benchmark_only", False) or \
        config.getoption("benchmark_enable", False)
    if not measuring and hasattr(config.option, "benchmark_disable"):
        config.option.benchmark_disable = True
    if not measuring:
        # Tests run the tensor-IR and loop-IR verifiers after every stage (tilegen/stages.py);
        # measured runs compile as users do.
        os.environ.setdefault("TILEGEN_VERIFY", "1")
    if measuring and getattr(config.option, "benchmark_json", False) is None:
        # A measured run is always kept, in the git-ignored bench-results/ (not the root).
        from bench.results import new_run_path

        config.option.benchmark_json = new_run_path().open("wb")
    if str(getattr(config.option, "benchmark_min_time", None)) == DEFAULT_MIN_TIME:
        config.option.benchmark_min_time = ROUND_MIN_TIME
