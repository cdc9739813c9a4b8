"""Repository-wide pytest settings.

Plain `pytest` runs every benchmark in bench/ once, as a correctness test (pytest-benchmark's
short mode), so the test command stays quick; `pytest --benchmark-only` (or
`--benchmark-enable`) measures them.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    measuring = config.getoption("benchmark_only", False) or \
        config.getoption("benchmark_enable", False)
    if not measuring and hasattr(config.option, "benchmark_disable"):
        config.option.benchmark_disable = True
