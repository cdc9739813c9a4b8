"""The driver's benchmarker (benchmarker.py), which `triton.autotune` times configs with:
warm calls, groups of calls each counted as its fastest, Triton's statistics."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

from triton.runtime.driver import driver  # noqa: E402

from tilegen.triton_backend import benchmarker  # noqa: E402


def test_the_autotuner_benchmarks_with_ours():
    assert driver.active.get_benchmarker() is benchmarker.do_bench


def test_calls_are_timed_warm(monkeypatch):
    """No flush of a 64 MB buffer before the calls (Triton's GPU do_bench zeroes one before
    each): every call finds the caches as the previous call left them."""
    clears = []
    monkeypatch.setattr(type(driver.active), "clear_cache",
                        lambda self, cache: clears.append(cache), raising=True)
    calls = []
    bench = driver.active.get_benchmarker()
    bench(lambda: calls.append(1), warmup=1, rep=1, quantiles=(0.5, 0.2, 0.8))
    assert not clears
    assert len(calls) >= 1 + 2 + benchmarker.MIN_GROUPS * benchmarker.GROUP_CALLS


def test_a_burst_of_load_does_not_move_the_median():
    """Two calls of every three slowed (another process's load): each group still has its
    undisturbed call, so the median is the fast calls' time; the median of single calls
    would be the slow one's."""
    count = [0]

    def fn():
        count[0] += 1
        time.sleep(0.012 if count[0] % 3 else 0.0005)
    median, low, high = driver.active.get_benchmarker()(fn, warmup=1, rep=1,
                                                        quantiles=(0.5, 0.2, 0.8))
    assert low <= median <= high
    assert median < 6.0, median  # ms; the slow calls took 12 ms


def test_statistics_as_asked():
    times = iter([1.0] * 100)
    bench = driver.active.get_benchmarker()
    all_times = bench(lambda: next(times, None), warmup=0, rep=0, return_mode="all")
    assert len(all_times) == benchmarker.MIN_GROUPS
    assert all(t >= 0 for t in all_times)
    single = bench(lambda: None, warmup=0, rep=0, quantiles=(0.5,))
    assert isinstance(single, float)
    with pytest.raises(ValueError, match="return_mode"):
        bench(lambda: None, return_mode="p99")


def test_summary_matches_triton_do_bench():
    """The statistics are triton.testing's: the same quantiles and modes of the same times."""
    import triton.testing

    times = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3]
    ours = benchmarker.summarize(times, (0.5, 0.2, 0.8), "mean")
    theirs = triton.testing._summarize_statistics(times, (0.5, 0.2, 0.8), "mean")
    assert ours == pytest.approx(theirs)
    for mode in ("min", "max", "mean", "median"):
        assert benchmarker.summarize(times, None, mode) == pytest.approx(
            triton.testing._summarize_statistics(times, None, mode))
    with pytest.raises(ValueError, match="quantiles"):
        benchmarker.summarize(times, (1.5,), "mean")
