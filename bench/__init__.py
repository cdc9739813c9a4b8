"""The tilegen benchmark suite (issue 6): tilegen side by side with its peers.

`pytest --benchmark-only` runs every group; `python bench/report.py run.json` turns a saved run
into the markdown report. See docs/benchmarks.md.
"""
