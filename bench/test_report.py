"""bench/report.py on a synthetic run: ratios, verdicts from the numbers, atomic outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import report


def _bench(group, provider, median, **extra):
    return {"group": group, "name": f"test[{provider}]", "param": provider,
            "extra_info": {"provider": provider, "threads": 1, **extra},
            "stats": {"median": median, "iqr": median / 10, "rounds": 7}}


def _run():
    return {
        "datetime": "2026-01-01T00:00:00", "commit_info": {"id": "abc", "dirty": False},
        "machine_info": {"python_version": "3.11", "tilegen_bench": {
            "cpu_model_name": "Test CPU", "llvm_host_cpu": "znver4", "cpu_count": 2,
            "cpu_features": "+avx512f,-amx-tile,+sse2",
            "threadpools": [{"internal_api": "openblas", "version": "0.3", "architecture":
                             "SkylakeX", "num_threads": 2, "threading_layer": "pthreads"}],
            "environment": {"OPENBLAS_CORETYPE": None}, "versions": {"numpy": "2"},
            "llvm_version": "22", "others_cpu_share": 0.25}},
        "benchmarks": [
            _bench(report.B1, "tilegen", 1e-6, units=1, unit="call"),
            _bench(report.B1, "numpy", 30e-6, units=1, unit="call"),
            _bench(report.B1, "numba", 4e-6, units=1, unit="call", compile_s=2.0),
            _bench(report.B2, "tilegen", 120e-6, units=120, unit="step"),
            _bench(report.B2, "numba", 120e-6, units=120, unit="step"),
            _bench("B5 matmul 1024^3", "tilegen", 0.02, flops=2 * 1024 ** 3),
            _bench("B5 matmul 1024^3", "numpy", 0.01, flops=2 * 1024 ** 3),
            _bench("B5 matmul 1024^3", "tilegen-1t", 0.04, flops=2 * 1024 ** 3),
            _bench("B5 matmul 1024^3", "numpy-1t", 0.02, flops=2 * 1024 ** 3),
            _bench("B5 matmul 1024^3", "torch.compile", 0.01, compile_s=3.0),
            _bench(report.B6_FORWARD, "tilegen-cold", 0.1, import_s=0.4, frontend_s=0.02,
                   machine_code_s=0.08),
            _bench(report.B6_FORWARD, "tilegen-same-process", 0.02),
            _bench(report.B8_LONG, "tilegen", 0.1, units=32, unit="sentence"),
            _bench(report.B8_LONG, "onnxruntime", 0.12, units=32, unit="sentence"),
            _bench(report.B8_LONG, "sentence-transformers", 0.14, units=32, unit="sentence"),
            _bench(report.B8_COMPILE, "tilegen", 1.5),
            _bench("B9 BF16 matmul 1024^3", "tilegen-bf16", 0.01, flops=2 * 1024 ** 3),
            _bench("B9 BF16 matmul 1024^3", "tilegen", 0.02, flops=2 * 1024 ** 3),
            _bench("B9 BF16 matmul 1024^3", "torch-bf16", 0.005, flops=2 * 1024 ** 3),
            _bench("B7 05 layer norm backward [4096, 1024]", "tilegen-triton", 0.004),
            _bench("B7 05 layer norm backward [4096, 1024]", "torch", 0.0036),
            _bench("B7 compile 06 _attn_fwd", "tilegen-triton", 0.25, mode="cold"),
            _bench("B7 compile 06 _attn_fwd", "tilegen-triton", 0.0004,
                   mode="from Triton's cache"),
        ]}


def test_verdicts_come_from_the_measured_ratios():
    groups = report.load_results(_run())
    verdicts = {(t.work, t.wording): t.evaluate(groups) for t in report.TARGETS}
    assert verdicts[("StoryLM-0 forward T = 36 (B1)", "≥ 20× numpy")] == ("30.00×", "met")
    assert verdicts[("StoryLM-0 forward T = 36 (B1)", "≥ 5× numba")] == ("4.00×", "missed")
    # "faster than numba" is strict: an equal time is missed
    assert verdicts[("training step, Python host loop (B2)", "faster than numba")] == \
        ("1.00×", "missed")
    assert verdicts[("fp32 matmul 1024³, all cores", "≥ 0.9× numpy")] == ("0.50×", "missed")
    assert verdicts[("row softmax [4096, 1024]", "≥ 1× torch")][1] == "not measured"
    # B9's BF16 rows divide by tilegen-bf16's time, not by tilegen's (the fp32 kernel)
    assert verdicts[("BF16 matmul 1024³ (B9)", "≥ 1.6× tilegen")] == ("2.00×", "met")
    assert verdicts[("BF16 matmul 1024³ (B9)", "≥ 1× torch-bf16")] == ("0.50×", "missed")
    assert verdicts[("BF16 matmul 2048³ (B9)", "≥ 1.6× tilegen")][1] == "not measured"
    assert verdicts[("compile storylm0_forward.kina, cold process", "≤ 150 ms")] == \
        ("100 ms", "met")
    assert verdicts[("compile storylm0_forward.kina, warm (same process)", "≤ 10 ms")] == \
        ("20 ms", "missed")
    long = "MiniLM encode 32 × 128 tokens (B8)"
    assert verdicts[(long, "≥ 1× onnxruntime")] == ("1.20×", "met")
    assert verdicts[(long, "≥ 1.5× sentence-transformers")] == ("1.40×", "missed")
    assert verdicts[("MiniLM encode 1 sentence (B8)", "≥ 3× sentence-transformers")][1] == \
        "not measured"
    assert verdicts[("MiniLM compile one (B, T) shape (B8)", "≤ 1 s")] == ("1.5 s", "missed")
    # B7 divides torch's time by the Triton backend's; a compile row is cold, not cached
    assert verdicts[("Triton 05 layer norm backward [4096, 1024] (B7)", "≥ 1× torch")] == \
        ("0.90×", "missed")
    assert verdicts[("Triton cold compile of 06 _attn_fwd (B7)", "≤ 200 ms")] == \
        ("250 ms", "missed")
    assert verdicts[("Triton cold compile of 02 softmax_kernel (B7)", "≤ 200 ms")][1] == \
        "not measured"


def test_report_tables(tmp_path):
    text = report.render(_run())
    assert "kernel (coretype) `SkylakeX`, 2 threads" in text
    assert "OPENBLAS_CORETYPE=unset" in text and "avx512f" in text and "amx-tile" not in text
    assert "| numpy | 1 | 30 µs |" in text and "30.00×" in text
    assert "| 120 µs | 12 µs | 7 | 1 µs |" in text  # per-step figure of the 120-step run
    assert "107.4" in text  # GF/s of tilegen's matmul
    assert "torch.compile: compile (first call)" in text
    assert "frontend 20 ms + machine code 80 ms" in text
    assert "25% of all cores' time" in text
    # numpy-1t (threads 1): 0.02 / 0.04 against tilegen-1t, 0.02 / 0.02 against tilegen
    assert "| numpy-1t | 1 | 20 ms | 2 ms | 7 | 107.4 | — | 1.00× | 0.50× |" in text
    # both compile rows of one provider, told apart by their mode
    assert "| tilegen-triton (cold) |" in text
    assert "| tilegen-triton (from Triton's cache) |" in text


def test_main_writes_markdown_and_chart_atomically(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run()))
    assert report.main([str(run_path)]) == 0
    assert (tmp_path / "run.md").read_text().startswith("# tilegen benchmark report")
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.md", "run.png"]
    assert "Targets (issues 8, 14, 15 and 16)" in capsys.readouterr().out


def test_runs_default_to_a_git_ignored_folder(tmp_path, monkeypatch):
    import subprocess

    from bench import results

    first = results.new_run_path(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("run-")
    assert results.latest_run(tmp_path) is None  # nothing written yet
    (tmp_path / "run-20260101-000000.json").write_text("{}")
    (tmp_path / "run-20261130-120000.json").write_text("{}")
    assert results.latest_run(tmp_path).name == "run-20261130-120000.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(results.RESULTS_DIR / "x.json")],
                             cwd=results.RESULTS_DIR.parent, check=False)
    assert ignored.returncode == 0, "bench-results/ must be git-ignored"
    # report.py without a run reads the newest there.
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "latest_run", lambda folder=tmp_path: folder / "run-x.json")
    (tmp_path / "run-x.json").write_text(json.dumps(_run()))
    assert report.main(["--no-chart"]) == 0
    assert (tmp_path / "run-x.md").read_text().startswith("# tilegen benchmark report")


def test_a_measured_run_keeps_its_json_in_bench_results():
    import conftest

    class Option:
        benchmark_only, benchmark_enable, benchmark_disable = True, False, False
        benchmark_min_time, benchmark_json = "0.0002", None

    class Config:
        option = Option()

        def getoption(self, name, default=None):
            return getattr(self.option, name, default)

    config = Config()
    conftest.pytest_configure(config)
    try:
        from bench.results import RESULTS_DIR

        assert config.option.benchmark_json.name.startswith(str(RESULTS_DIR / "run-"))
    finally:
        config.option.benchmark_json.close()
        import os

        os.unlink(config.option.benchmark_json.name)


def test_paired_rounds_ratio_and_interval():
    from bench.common import paired_ratio

    # torch 10 % slower in every round, with noise both share: the ratio is 1.1 exactly
    rng = np.random.default_rng(1)
    ours = rng.uniform(1.0, 2.0, 200)
    ratio, low, high = paired_ratio(list(ours), list(ours * 1.1))
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and \
        high == pytest.approx(1.1)
    # per-round ratios spread around 1: the interval holds the median and brackets 1
    ratio, low, high = paired_ratio(list(ours), list(ours * rng.uniform(0.9, 1.1, 200)))
    assert low <= ratio <= high and low < 1 < high and high - low < 0.05


def test_paired_target_reads_the_alternating_rounds():
    group = "B9 BF16 matmul 1024^3, alternating rounds"
    run = _run()
    run["benchmarks"].append(_bench(group, "tilegen-bf16 vs torch-bf16", 0.01, paired=True,
                                    ours="tilegen-bf16", peer="torch-bf16",
                                    ours_median=0.005, peer_median=0.0049, ratio=0.98,
                                    ratio_low=0.97, ratio_high=0.995, flops=2 * 1024 ** 3))
    groups = report.load_results(run)
    verdicts = {(t.work, t.wording): t.evaluate(groups) for t in report.TARGETS}
    work = "BF16 matmul 1024³, alternating rounds (B9)"
    assert verdicts[(work, "≥ 1× torch-bf16")] == ("0.98× (95%: 0.97-0.99)", "missed")
    assert verdicts[("BF16 matmul 2048³, alternating rounds (B9)", "≥ 1× torch-bf16")][1] == \
        "not measured"
    text = report.render(run)
    assert "| tilegen-bf16 | 5 ms | 7 | 429.5 |" in text
    assert "| torch-bf16 / tilegen-bf16, per round | 0.980× |  | 95%: 0.970-0.995 |" in text
