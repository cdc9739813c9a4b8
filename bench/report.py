"""Turn a saved benchmark run into the markdown report and a bar chart.

    pytest --benchmark-only           # writes bench-results/run-<time>.json (git-ignored)
    python bench/report.py [run.json] [--markdown run.md] [--png run.png]

Prints the markdown (and writes it, default: next to the JSON with the suffix .md) and writes
the chart (default .png); without a run, the newest in bench-results/. The report has:

- the machine: CPU (/proc/cpuinfo and LLVM's host CPU name), the OpenBLAS kernel (coretype)
  and thread count threadpoolctl reported, the other thread pools, the environment knobs
  (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE, ...), the load average, library versions;
- issue 8's and issue 15's targets as ratios with a verdict column, computed from the
  measured medians;
- per group: each provider's median, IQR and rounds, threads, the per-unit figure (per step,
  per token), GF/s for matmuls, the first-call (compile) time, and the speed-up of tilegen
  over that provider = provider median / tilegen median (> 1: tilegen is faster); where the
  group has `tilegen-1t` (compiled with TILEGEN_NUM_THREADS=1), also its speed-up over the
  single-threaded rows;
- the peers' medians against the figures issue 8 quotes for this machine.

Everything is computed from the JSON; nothing about the outcome is written in by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Row order within a group (bench.common.PROVIDERS, repeated here so this script stands alone).
PROVIDER_ORDER = ("tilegen", "tilegen-1t", "tilegen-attribute", "tilegen-bf16",
                  "tilegen-bf16-dot", "tilegen-bf16x3", "tilegen-f32", "numpy", "numpy-1t", "torch",
                  "torch-1t", "torch-bf16",
                  "torch-sdpa", "torch.compile", "jax", "jax-fori", "numba",
                  "sentence-transformers", "onnxruntime", "tilegen-cold",
                  "tilegen-same-process", "torch.compile-cold", "jax-cold", "numba-cold")
BASELINES = ("tilegen", "tilegen-cold")  # whose time the speed-ups divide by


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Result:
    group: str
    provider: str
    median: float  # seconds per timed call
    iqr: float
    rounds: int
    extra: dict

    @property
    def units(self) -> int:
        return int(self.extra.get("units") or 1)

    @property
    def unit(self) -> str:
        return self.extra.get("unit") or "call"

    @property
    def per_unit(self) -> float:
        return self.median / self.units

    @property
    def gflops(self) -> float | None:
        flops = self.extra.get("flops")
        return flops / self.median / 1e9 if flops else None


def load_results(run: dict) -> dict[str, dict[str, Result]]:
    """group -> provider -> Result."""
    groups: dict[str, dict[str, Result]] = {}
    for bench in run.get("benchmarks", []):
        extra = bench.get("extra_info", {})
        provider = extra.get("provider") or bench.get("param") or bench["name"]
        if extra.get("mode"):  # B7's compile rows: one provider, cold and from the cache
            provider = f"{provider} ({extra['mode']})"
        stats = bench["stats"]
        result = Result(group=bench.get("group") or bench["name"], provider=provider,
                        median=stats["median"], iqr=stats["iqr"], rounds=stats["rounds"],
                        extra=extra)
        groups.setdefault(result.group, {})[provider] = result
    return groups


def _group_key(name: str):
    """B-number first; within B5 the matmuls by size, then the other kernels."""
    match = re.match(r"B(\d+)\s+(.*)", name)
    if not match:
        return (99, 1, 0, name)
    rest = match.group(2)
    dims = re.fullmatch(r"matmul (\d+)\^3", rest)
    size = int(dims.group(1)) ** 3 if dims else 0
    dims = re.fullmatch(r"matmul (\d+)x(\d+)x(\d+)", rest)
    if dims:
        size = math.prod(int(d) for d in dims.groups())
    return (int(match.group(1)), 0 if size else 1, size, rest)


def ordered_groups(groups: dict) -> list[str]:
    return sorted(groups, key=_group_key)


def _provider_key(provider: str):
    return PROVIDER_ORDER.index(provider) if provider in PROVIDER_ORDER else len(PROVIDER_ORDER)


def baseline(results: dict[str, Result]) -> Result | None:
    for name in BASELINES:
        if name in results:
            return results[name]
    return None


def speedup(results: dict[str, Result], peer: str) -> float | None:
    """peer median / tilegen median: how many times faster tilegen is (> 1) or slower (< 1)."""
    base = baseline(results)
    if base is None or peer not in results or base.median <= 0:
        return None
    return results[peer].median / base.median


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class RatioTarget:
    """tilegen (or the provider `ours`) at least `at_least` times as fast as `peer` on
    `group` (strictly faster when `strict`)."""

    work: str
    group: str
    peer: str
    at_least: float
    strict: bool = False
    ours: str | None = None

    @property
    def wording(self) -> str:
        if self.strict and self.at_least == 1:
            return f"faster than {self.peer}"
        return f"≥ {self.at_least:g}× {self.peer}"

    def evaluate(self, groups) -> tuple[str, str]:
        results = groups.get(self.group, {})
        if self.ours is not None:
            ours = results.get(self.ours)
            ratio = results[self.peer].median / ours.median \
                if ours is not None and self.peer in results and ours.median > 0 else None
        else:
            ratio = speedup(results, self.peer)
        if ratio is None:
            return "not measured", "not measured"
        met = ratio > self.at_least if self.strict else ratio >= self.at_least
        return f"{ratio:.2f}×", "met" if met else "missed"


@dataclass(frozen=True)
class TimeTarget:
    """`provider` median on `group` at most `at_most` seconds."""

    work: str
    group: str
    provider: str
    at_most: float

    @property
    def wording(self) -> str:
        return f"≤ {format_time(self.at_most)}"

    def evaluate(self, groups) -> tuple[str, str]:
        result = groups.get(self.group, {}).get(self.provider)
        if result is None:
            return "not measured", "not measured"
        return format_time(result.median), "met" if result.median <= self.at_most else "missed"


@dataclass(frozen=True)
class PairedTarget:
    """`ours` at least `at_least` times as fast as `peer`, from a benchmark of alternating
    rounds (bench.common.measure_paired): the median per-round ratio, shown with its
    bootstrap 95% interval."""

    work: str
    group: str
    peer: str
    at_least: float

    @property
    def wording(self) -> str:
        return f"≥ {self.at_least:g}× {self.peer}"

    def evaluate(self, groups) -> tuple[str, str]:
        paired = [r for r in groups.get(self.group, {}).values()
                  if r.extra.get("paired") and r.extra.get("peer") == self.peer]
        if not paired:
            return "not measured", "not measured"
        extra = paired[0].extra
        ratio = extra["ratio"]
        return (f"{ratio:.2f}× (95%: {extra['ratio_low']:.2f}-{extra['ratio_high']:.2f})",
                "met" if ratio >= self.at_least else "missed")


B1 = "B1 StoryLM-0 forward T=36"
B1_OVERHEAD = "B1 call overhead, 9 arguments"
B2 = "B2 StoryLM-0 training, 120 steps"
B3 = "B3 StoryLM-0 greedy rollout, 32 tokens"
B6_FORWARD = "B6 compile storylm0_forward.kina"
B8_ONE = "B8 MiniLM encode 1 sentence"
B8_LONG = "B8 MiniLM encode 32 x 128 tokens"
B8_COMPILE = "B8 MiniLM compile one (B, T) shape"

# Issue 8, "Our targets, as ratios measured side by side in one run", and issues 14's (B7),
# 15's (B8) and 16's (B9).
TARGETS = (
    RatioTarget("StoryLM-0 forward T = 36 (B1)", B1, "numpy", 20),
    RatioTarget("StoryLM-0 forward T = 36 (B1)", B1, "numba", 5),
    RatioTarget("training step, Python host loop (B2)", B2, "numpy", 20),
    RatioTarget("training step, Python host loop (B2)", B2, "numba", 1, strict=True),
    RatioTarget("rollout token, Python host loop (B3)", B3, "numpy", 20),
    RatioTarget("rollout token, Python host loop (B3)", B3, "numba", 1, strict=True),
    RatioTarget("fp32 matmul 1024³, all cores", "B5 matmul 1024^3", "numpy", 0.9),
    RatioTarget("fp32 matmul 2048³, all cores", "B5 matmul 2048^3", "numpy", 0.9),
    RatioTarget("fp32 matmul 333×1000×777", "B5 matmul 333x1000x777", "numpy", 0.8),
    RatioTarget("row softmax [4096, 1024]", "B5 row softmax [4096, 1024]", "torch", 1),
    RatioTarget("scaled StoryLM forward (B4)", "B4 scaled StoryLM forward", "torch.compile",
                1),
    RatioTarget("scaled StoryLM train step (B4)", "B4 scaled StoryLM train step",
                "torch.compile", 1),
    TimeTarget("compiled call from Python, StoryLM's nine arrays (B1)", B1_OVERHEAD,
               "tilegen", 1.5e-6),
    TimeTarget("compile storylm0_forward.kina, cold process", B6_FORWARD, "tilegen-cold",
               0.150),
    TimeTarget("compile storylm0_forward.kina, warm (same process)", B6_FORWARD,
               "tilegen-same-process", 0.010),
    # Issue 15: all-MiniLM-L6-v2 (B8).
    RatioTarget("MiniLM encode 32 × 128 tokens (B8)", B8_LONG, "onnxruntime", 1),
    RatioTarget("MiniLM encode 32 × 128 tokens (B8)", B8_LONG, "sentence-transformers", 1.5),
    RatioTarget("MiniLM encode 32 × 128 tokens, bf16x3 products (B8)", B8_LONG,
                "sentence-transformers", 1.5, ours="tilegen-bf16x3"),
    RatioTarget("MiniLM encode 1 sentence (B8)", B8_ONE, "sentence-transformers", 3),
    TimeTarget("MiniLM compile one (B, T) shape (B8)", B8_COMPILE, "tilegen", 1.0),
    # Issue 16: fused causal attention (B9), at least torch's fused SDPA from T = 1024.
    *(RatioTarget(f"causal attention T = {t} (B9)", f"B9 causal attention [1, 8, {t}, 64]",
                  "torch-sdpa", 1) for t in (1024, 2048, 4096)),
    # Issue 16, BF16 (B9): tilegen's BF16 against its own fp32 kernel and torch bf16.
    *(RatioTarget(f"BF16 matmul {label} (B9)", f"B9 BF16 matmul {group}", peer, at_least,
                  ours="tilegen-bf16")
      for label, group in (("1024³", "1024^3"), ("2048³", "2048^3"),
                           ("333×1000×777", "333x1000x777"))
      for peer, at_least in (("tilegen", 1.6), ("torch-bf16", 1))),
    *(PairedTarget(f"BF16 matmul {label}, alternating rounds (B9)",
                   f"B9 BF16 matmul {group}, alternating rounds", "torch-bf16", 1)
      for label, group in (("1024³", "1024^3"), ("2048³", "2048^3"),
                           ("333×1000×777", "333x1000x777"))),
    RatioTarget("MiniLM encode 32 × 128 tokens, BF16 weights vs F32 (B9)",
                "B9 MiniLM BF16 weights, encode 32 x 128 tokens", "tilegen", 1.3,
                ours="tilegen-bf16"),
    # Issue 14: the Triton tutorials' kernels through the tilegen backend (B7).
    *(RatioTarget(f"Triton {work} (B7)", f"B7 {work}", "torch", at_least,
                  ours="tilegen-triton")
      for work, at_least in (("01 vector add 2^24", 0.9),
                             ("02 fused softmax [4096, 1024]", 1),
                             ("03 matmul 1024^3 fp32 in fp16 out (autotuned)", 0.9),
                             ("05 layer norm forward [4096, 4096]", 1),
                             ("05 layer norm backward [4096, 1024]", 1),
                             ("06 fused attention T=1024 D=64 (4 heads)", 1))),
    *(TimeTarget(f"Triton cold compile of {kernel} (B7)", f"B7 compile {kernel}",
                 "tilegen-triton (cold)", 0.200)
      for kernel in ("01 add_kernel", "02 softmax_kernel", "03 matmul_kernel",
                     "04 _seeded_dropout", "05 _layer_norm_fwd_fused", "06 _attn_fwd",
                     "07 asin_kernel")),
)

# The peers' figures issue 8 quotes for this machine: (group, provider) -> (value, kind),
# kind "per_unit" in seconds or "gflops". Shown next to ours to tell a loaded machine apart.
ISSUE8_PEERS = {
    (B1, "numpy"): (25.8e-6, "per_unit"), (B1, "torch"): (38e-6, "per_unit"),
    (B1, "torch.compile"): (49e-6, "per_unit"), (B1, "jax"): (21e-6, "per_unit"),
    (B1, "numba"): (8.7e-6, "per_unit"),
    (B2, "numpy"): (55e-6, "per_unit"), (B2, "torch"): (264e-6, "per_unit"),
    (B2, "torch.compile"): (209e-6, "per_unit"), (B2, "jax-fori"): (9e-6, "per_unit"),
    (B2, "numba"): (2.7e-6, "per_unit"),
    (B3, "numpy"): (29e-6, "per_unit"), (B3, "torch"): (43e-6, "per_unit"),
    (B3, "torch.compile"): (56e-6, "per_unit"), (B3, "jax-fori"): (10e-6, "per_unit"),
    (B3, "numba"): (11e-6, "per_unit"),
    ("B4 scaled StoryLM forward", "numpy"): (6.7e-3, "per_unit"),
    ("B4 scaled StoryLM forward", "torch"): (5.1e-3, "per_unit"),
    ("B4 scaled StoryLM forward", "torch.compile"): (4.6e-3, "per_unit"),
    ("B4 scaled StoryLM forward", "jax"): (5.3e-3, "per_unit"),
    ("B4 scaled StoryLM train step", "numpy"): (26e-3, "per_unit"),
    ("B4 scaled StoryLM train step", "torch"): (20e-3, "per_unit"),
    ("B4 scaled StoryLM train step", "torch.compile"): (18e-3, "per_unit"),
    ("B4 scaled StoryLM train step", "jax"): (26e-3, "per_unit"),
    ("B5 matmul 1024^3", "numpy-1t"): (169.0, "gflops"),
    ("B5 matmul 1024^3", "numpy"): (350.0, "gflops"),
    ("B5 matmul 1024^3", "torch-1t"): (178.0, "gflops"),
    ("B5 matmul 1024^3", "torch"): (387.0, "gflops"),
    ("B5 row softmax [4096, 1024]", "numpy"): (10.8e-3, "per_unit"),
    ("B5 row softmax [4096, 1024]", "torch-1t"): (2.3e-3, "per_unit"),
    ("B5 row softmax [4096, 1024]", "numba"): (16e-3, "per_unit"),
}


# --------------------------------------------------------------------------- formatting


def format_time(seconds: float) -> str:
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if seconds >= scale or unit == "ns":
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def _machine_section(run: dict) -> list[str]:
    info = run.get("machine_info", {})
    facts = info.get("tilegen_bench")
    if facts is None:  # a run saved before the conftest recorded them: describe this machine
        sys.path.insert(0, str(REPO))
        from bench.conftest import machine_facts
        facts = machine_facts()
        facts["note"] = "machine facts taken when the report was made, not with the run"
    commit = run.get("commit_info", {})
    lines = ["## Machine and libraries", ""]
    rows = [
        ("run", f"{run.get('datetime', '?')}, commit {str(commit.get('id', '?'))[:10]}"
                f"{' (dirty tree)' if commit.get('dirty') else ''}"),
        ("CPU", f"{facts.get('cpu_model_name')} (LLVM host CPU `{facts.get('llvm_host_cpu')}`,"
                f" {facts.get('cpu_count')} cores)"),
    ]
    features = facts.get("cpu_features") or ""
    wide = sorted(f[1:] for f in features.split(",") if f.startswith("+") and
                  (f.startswith("+avx512") or f.startswith("+amx")))
    if wide:
        rows.append(("vector features", ", ".join(wide)))
    for pool in facts.get("threadpools", []):
        owner = f" in {pool['package']}" if pool.get("package") else ""
        if pool.get("internal_api") == "openblas":
            rows.append((f"OpenBLAS{owner} (threadpoolctl)",
                         f"{pool.get('version')}, kernel (coretype) `{pool.get('architecture')}`"
                         f", {pool.get('num_threads')} threads ({pool.get('threading_layer')})"))
        else:
            version = f" {pool['version']}" if pool.get("version") else ""
            rows.append((f"{pool.get('internal_api')}{owner} (threadpoolctl)",
                         f"{pool.get('prefix')}{version}, {pool.get('num_threads')} threads"))
    torch_facts = facts.get("torch")
    if torch_facts:
        rows.append(("PyTorch", f"{torch_facts['num_threads']} intra-op threads by default, "
                                f"MKL {'on' if torch_facts['mkl'] else 'off'}, oneDNN "
                                f"{'on' if torch_facts['mkldnn'] else 'off'}"))
    environment = facts.get("environment", {})
    rows.append(("environment", ", ".join(f"{k}={v if v is not None else 'unset'}"
                                          for k, v in environment.items())))
    start, end = facts.get("load_average_start"), facts.get("load_average_end")
    if start or end:
        rows.append(("load average (1/5/15 min)",
                     f"{_load(start)} at start, {_load(end)} at end"
                     " (above the core count means other jobs shared the cores)"))
    share = facts.get("others_cpu_share")
    if share is not None:
        rows.append(("other processes during the run",
                     f"{share:.0%} of all cores' time (0% = the run had the machine to itself; "
                     "multi-threaded rows suffer first)"))
    versions = facts.get("versions", {})
    rows.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v) +
                 f", LLVM {facts.get('llvm_version')}, Python "
                 f"{info.get('python_version', '?')}"))
    missing = [k for k, v in versions.items() if not v]
    if missing:
        rows.append(("not installed", ", ".join(missing)))
    if facts.get("note"):
        rows.append(("note", facts["note"]))
    return lines + _table(("", ""), rows) + [""]


def _load(values) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def _targets_section(groups) -> list[str]:
    rows = []
    for target in TARGETS:
        measured, verdict = target.evaluate(groups)
        rows.append((target.work, target.wording, measured, verdict))
    lines = ["## Targets (issues 8, 14, 15 and 16)", "",
             "Speed-up = peer median / tilegen median in the same run (per call, step or "
             "token alike, since both do the same work); compile targets are tilegen's own "
             "median.", ""]
    return lines + _table(("work", "target", "measured", "verdict"), rows) + [""]


def _paired_section(name: str, results: dict[str, Result]) -> list[str]:
    """A group of alternating rounds: each side's median, and the per-round ratio."""
    rows = []
    for result in results.values():
        extra = result.extra
        for side in ("ours", "peer"):
            seconds = extra[f"{side}_median"]
            flops = extra.get("flops")
            rows.append([extra[side], format_time(seconds), str(result.rounds),
                         f"{flops / seconds / 1e9:.1f}" if flops else "—"])
        rows.append([f"{extra['peer']} / {extra['ours']}, per round", f"{extra['ratio']:.3f}×",
                     "", f"95%: {extra['ratio_low']:.3f}-{extra['ratio_high']:.3f}"])
    return [f"### {name}", "", "Both providers in alternating rounds (one call each, the "
            "order swapped every round); the ratio is the median of the rounds' ratios, "
            "with a bootstrap 95% interval.", ""] + \
        _table(("provider", "median", "rounds", "GF/s"), rows) + [""]


def _group_section(name: str, results: dict[str, Result]) -> list[str]:
    """One table per group; the per-unit, GF/s and first-call columns appear where some row
    has them. tilegen's own rows (e.g. B6's same-process compile) get no speed-up."""
    base = baseline(results)
    providers = sorted(results, key=_provider_key)
    units = sorted({results[p].unit for p in providers if results[p].units > 1})
    show_per = bool(units)
    show_gflops = any(results[p].gflops for p in providers)
    show_first = any(results[p].extra.get("compile_s") for p in providers)
    header = ["provider", "threads", "median", "IQR", "rounds"]
    header += ["per " + "/".join(units)] * show_per + ["GF/s"] * show_gflops
    single = results.get("tilegen-1t")
    header += ["first call"] * show_first + ["tilegen speed-up"]
    header += ["tilegen-1t speed-up (1-thread rows)"] * (single is not None)
    rows = []

    def note_row(label: str, value: str) -> None:
        rows.append([label, "", value] + [""] * (len(header) - 3))

    for provider in providers:
        result = results[provider]
        ratio = speedup(results, provider)
        first = result.extra.get("compile_s")
        row = [provider, str(result.extra.get("threads", "?")), format_time(result.median),
               format_time(result.iqr), str(result.rounds)]
        if show_per:
            row.append(format_time(result.per_unit) if result.units > 1 else "—")
        if show_gflops:
            row.append(f"{result.gflops:.1f}" if result.gflops else "—")
        if show_first:
            row.append(format_time(first) if first else "—")
        tilegen_row = provider.startswith("tilegen") or base is None
        row.append("—" if tilegen_row or ratio is None else f"{ratio:.2f}×")
        if single is not None:
            one_thread = result.extra.get("threads") == 1 and not tilegen_row
            row.append(f"{result.median / single.median:.2f}×" if one_thread else "—")
        rows.append(row)
        if provider == "torch.compile" and first:
            note_row("torch.compile: compile (first call)", format_time(first))
        if "import_s" in result.extra:
            note_row(f"{provider}: import, not in the median",
                     format_time(result.extra["import_s"]))
        if "frontend_s" in result.extra and "machine_code_s" in result.extra:
            note_row(f"{provider}: of which", f"frontend {format_time(result.extra['frontend_s'])}"
                     f" + machine code {format_time(result.extra['machine_code_s'])}")
    return [f"### {name}", ""] + _table(header, rows) + [""]


def _peers_section(groups) -> list[str]:
    rows = []
    for (group, provider), (value, kind) in ISSUE8_PEERS.items():
        result = groups.get(group, {}).get(provider)
        if kind == "gflops":
            quoted = f"{value:.0f} GF/s"
            here = f"{result.gflops:.0f} GF/s" if result and result.gflops else "not measured"
        else:
            quoted = format_time(value)
            here = format_time(result.per_unit) if result else "not measured"
        rows.append((group, provider, quoted, here))
    lines = ["## Peers against issue 8's figures", "",
             "Per call, step or token (or GF/s). Peers much slower here than there usually "
             "mean the cores were shared during the run; the ratios above compare both sides "
             "under the same conditions.", ""]
    return lines + _table(("work", "peer", "issue 8", "this run"), rows) + [""]


def render(run: dict) -> str:
    groups = load_results(run)
    lines = ["# tilegen benchmark report", ""]
    lines += _machine_section(run)
    lines += _targets_section(groups)
    lines += ["## Groups", "",
              "Medians of the timed rounds (one round = one call of the work named by the "
              "group); `first call` is the provider's compile + first run, outside the "
              "median. `tilegen speed-up` = provider median / tilegen median.", ""]
    for name in ordered_groups(groups):
        paired = any(r.extra.get("paired") for r in groups[name].values())
        lines += (_paired_section if paired else _group_section)(name, groups[name])
    lines += _peers_section(groups)
    return "\n".join(lines)


# --------------------------------------------------------------------------- chart


def write_chart(run: dict, path: Path) -> None:
    """One panel per group: each provider's median (log scale), tilegen highlighted. Written
    to a temporary name in the same folder, then renamed over `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    groups = load_results(run)
    names = ordered_groups(groups)
    columns = 3
    rows = max(1, math.ceil(len(names) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 2.6 * rows),
                                squeeze=False)
    for axis, name in zip(axes.flat, names, strict=False):
        results = groups[name]
        providers = sorted(results, key=_provider_key)
        medians = [results[p].median for p in providers]
        paired = [r.extra for r in results.values() if r.extra.get("paired")]
        if paired:  # alternating rounds: each side's median
            providers = [paired[0]["ours"], paired[0]["peer"]]
            medians = [paired[0]["ours_median"], paired[0]["peer_median"]]
        colors = ["tab:orange" if p.startswith("tilegen") else "tab:blue" for p in providers]
        axis.barh(providers, medians, color=colors)
        axis.set_xscale("log")
        axis.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short spans
        axis.invert_yaxis()
        axis.set_title(name, fontsize=9)
        axis.tick_params(labelsize=7)
        for position, value in enumerate(medians):
            axis.text(value, position, " " + format_time(value), va="center", fontsize=6)
    for axis in list(axes.flat)[len(names):]:
        axis.set_visible(False)
    figure.suptitle("tilegen vs peers: median time per timed call (log scale; lower is "
                    "better)", fontsize=11)
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png",
                                       dir=path.parent)
    os.close(handle)
    try:
        figure.savefig(staging, dpi=110)
        _publish(staging, path)
    finally:
        plt.close(figure)
        if os.path.exists(staging):
            os.unlink(staging)


def _publish(staging: str, path: Path) -> None:
    """Give the temporary file the usual permissions (mkstemp makes it 0600), then rename."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(staging, 0o666 & ~mask)
    os.replace(staging, path)


def write_text(path: Path, text: str) -> None:
    """Atomic write: a temporary file in the same folder, then rename."""
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        _publish(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, nargs="?",
                        help="the JSON of `pytest --benchmark-json=...` (default: the newest "
                             "run in bench-results/)")
    parser.add_argument("--markdown", type=Path, help="markdown output (default RUN.md)")
    parser.add_argument("--png", type=Path, help="chart output (default RUN.png)")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    options = parser.parse_args(argv)
    if options.run is None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from bench.results import RESULTS_DIR, latest_run

        options.run = latest_run()
        if options.run is None:
            parser.error(f"no run given and none in {RESULTS_DIR} (run `pytest "
                         "--benchmark-only` first)")
    try:
        run = json.loads(options.run.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        parser.error(f"cannot read {options.run}: {error}")
    text = render(run)
    write_text(options.markdown or options.run.with_suffix(".md"), text + "\n")
    if not options.no_chart:
        write_chart(run, options.png or options.run.with_suffix(".png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
