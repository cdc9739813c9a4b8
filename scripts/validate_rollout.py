#!/usr/bin/env python3
"""Section 23 validation: the StoryLM-0 32-token checkpoint rollout through tilegen.

    python scripts/validate_rollout.py          # examples compiled to .so files in a
                                                # temporary build folder, removed at exit
    python scripts/validate_rollout.py --jit    # in-process JIT; writes nothing to disk

The host loop holds the [1, 36] id buffer (prompt [1, 4, 2, 6], then pad 0) and, for each
of 32 steps, calls the compiled `storylm0_rollout` (T = 36), reads logit row 3 + s and
decodes it with the compiled `greedy_row` (Section 17 argmax) or `sample_row` (Section 18
Gumbel-max at temperature 0.8 on a RandomState(42) Uniform(1e-6, 1 - 1e-6) stream, one row
of 8 float32 uniforms per step), writing id 4 + s. Every checked number comes from the
compiled code; NumPy (storylm.reference) and PyTorch (when importable) are the references.

  (a) logits[:, 0:4, :] of the padded T = 36 buffer match the compiled T = 4
      `storylm0_forward` (examples/storylm0_forward.kina) on [1, 4, 2, 6];
  (b) 32 greedy tokens, twice: the runs agree with each other and with the NumPy rollout;
  (c) 32 sampled tokens, twice: likewise;
  (d) causal non-leak: changing the last id leaves every earlier logit row unchanged --
      on the compiled output, in NumPy, and in PyTorch (the same algebra).

Prints the prompt, both sequences decoded through vocab.json and a PASS/FAIL table; exits 1
when any check fails, 2 when the fixture or the examples cannot be loaded or compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# A source checkout, or the installed package (tilegen/scripts, next to tilegen/examples).
REPO = Path(__file__).resolve().parents[1]
if (REPO / "storylm").is_dir() and str(REPO) not in sys.path:  # a checkout, not installed
    sys.path.insert(0, str(REPO))

from storylm import fixture, reference  # noqa: E402
from storylm.checks import Report  # noqa: E402

ROLLOUT_EXAMPLE = REPO / "examples" / "storylm0_rollout.kina"
FORWARD_EXAMPLE = REPO / "examples" / "storylm0_forward.kina"

PROMPT = (1, 4, 2, 6)
T = reference.ROLLOUT_LENGTH  # 36 = 4 prompt + 32 generated
STEPS = reference.ROLLOUT_STEPS  # 32
FORWARD_T = 4
SEED = reference.SAMPLING_SEED  # 42
TEMPERATURE = reference.SAMPLING_TEMPERATURE  # 0.8
# (a) compares two compiled kernels that sum over 36 vs 4 keys (the 32 masked ones add
# exact zeros), so they agree to float32 rounding.
PREFIX_RTOL = 1e-5
PREFIX_ATOL = 1e-6


# ---- results ------------------------------------------------------------------------------

# ---- the compiled programs and the host loop ----------------------------------------------

@contextlib.contextmanager
def compiled_programs(jit: bool) -> Iterator[tuple[object, object, str]]:
    """(rollout module, forward module, where) -- JIT in memory, or .so files in a temporary
    build folder that is removed when the block ends (the loaded libraries stay mapped)."""
    import tilegen
    from tilegen.staging import temporary_directory

    if jit:
        yield (tilegen.compile_file(ROLLOUT_EXAMPLE, jit=True),
               tilegen.compile_file(FORWARD_EXAMPLE, jit=True), "in-process JIT")
        return
    with temporary_directory("validate_rollout-") as build:
        rollout = tilegen.compile_file(ROLLOUT_EXAMPLE, jit=False,
                                       output=str(Path(build) / "storylm0_rollout.so"))
        forward = tilegen.compile_file(FORWARD_EXAMPLE, jit=False,
                                       output=str(Path(build) / "storylm0_forward.so"))
        yield rollout, forward, f".so files in {build} (removed at exit)"


class HostLoop:
    """Section 23 host loop around one compiled program. Every buffer is allocated once:
    the [1, 36] ids, the [1, 36, 8] logits (written through out=), the 32 row views into
    them, the [32, 1, 1, 8] uniforms and the decoded [1, 1] token. A step is one forward
    call, one decode call and one id write."""

    def __init__(self, module, checkpoint: fixture.Checkpoint):
        self.forward = module.storylm0_rollout
        self.greedy = module.greedy_row
        self.sample = module.sample_row
        self.ids = np.zeros((1, T), dtype=np.int64)
        self.logits = np.empty((1, T, checkpoint.widths.vocab_size), dtype=np.float32)
        self.token = np.empty((1, 1), dtype=np.int64)
        self.temperature = np.full((1, 1), TEMPERATURE, dtype=np.float32)
        self.uniforms = np.empty((STEPS, 1, 1, checkpoint.widths.vocab_size), dtype=np.float32)
        first = len(PROMPT) - 1
        # logits[:, r:r+1, :] of a C-contiguous buffer is itself contiguous: no copy per step.
        self.rows = [self.logits[:, first + s:first + s + 1, :] for s in range(STEPS)]
        self.args = (self.ids, checkpoint.embed, fixture.causal_mask(T), checkpoint.scale,
                     checkpoint.wq, checkpoint.wk, checkpoint.wv, checkpoint.wo,
                     checkpoint.lm_head)

    def reset(self) -> None:
        self.ids.fill(fixture.PAD_ID)
        self.ids[0, :len(PROMPT)] = PROMPT

    def logits_for(self, ids: np.ndarray) -> np.ndarray:
        """One compiled forward on `ids` (a fresh result array)."""
        return self.forward(ids, *self.args[1:])

    def run(self, mode: str) -> list[int]:
        self.reset()
        forward, args, logits, ids, token = self.forward, self.args, self.logits, self.ids, \
            self.token
        first = len(PROMPT)
        if mode == "greedy":
            greedy = self.greedy
            for step, row in enumerate(self.rows):
                forward(*args, out=logits)
                greedy(row, out=token)
                ids[0, first + step] = token[0, 0]
        else:
            # The stream is drawn in step order, one row of 8 per step -- the same numbers
            # a per-step draw would give -- so the loop itself only calls compiled code.
            stream = np.random.RandomState(SEED)
            for step in range(STEPS):
                self.uniforms[step] = reference.uniform_row(stream)
            sample, temperature = self.sample, self.temperature
            for step, (row, u) in enumerate(zip(self.rows, self.uniforms, strict=True)):
                forward(*args, out=logits)
                sample(row, u, temperature, out=token)
                ids[0, first + step] = token[0, 0]
        return ids[0].tolist()


# ---- PyTorch: the same algebra, as a second reference for (d) -------------------------------

def torch_logits(ids: np.ndarray, checkpoint: fixture.Checkpoint) -> np.ndarray:
    import torch

    def t(array):
        return torch.from_numpy(np.array(array, dtype=np.float32))

    length = ids.shape[1]
    heads, head_dim = checkpoint.widths.heads, checkpoint.widths.head_dim
    x = t(checkpoint.embed)[torch.from_numpy(ids)]  # [1, T, D]

    def split(projected):
        return projected.reshape(1, length, heads, head_dim).permute(0, 2, 1, 3)
    q, k, v = (split(x @ t(w)) for w in (checkpoint.wq, checkpoint.wk, checkpoint.wv))
    scores = q @ k.transpose(2, 3) * t(checkpoint.scale) + t(fixture.causal_mask(length))
    attended = (torch.softmax(scores, dim=3) @ v).permute(0, 2, 1, 3).reshape(1, length, -1)
    return ((x + attended @ t(checkpoint.wo)) @ t(checkpoint.lm_head)).numpy()


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


# ---- the checks ---------------------------------------------------------------------------

def decode(ids: list[int], vocab: tuple[str, ...]) -> str:
    return " ".join(vocab[i] for i in ids)


def check_prefix(report: Report, loop: HostLoop, forward_module,
                 checkpoint: fixture.Checkpoint) -> None:
    loop.reset()
    padded = loop.logits_for(loop.ids)
    prompt = np.array([PROMPT], dtype=np.int64)
    short = forward_module.storylm0_forward(
        prompt, checkpoint.embed, fixture.causal_mask(FORWARD_T), checkpoint.scale,
        checkpoint.wq, checkpoint.wk, checkpoint.wv, checkpoint.wo, checkpoint.lm_head)
    prefix = padded[:, :FORWARD_T, :]
    diff = float(np.max(np.abs(prefix - short)))
    numpy_diff = float(np.max(np.abs(short - reference.forward_weights(prompt, checkpoint))))
    passed = bool(np.allclose(prefix, short, rtol=PREFIX_RTOL, atol=PREFIX_ATOL))
    report.add("(a) T=36 logits[:, 0:4] == T=4 storylm0_forward", passed,
               f"max |diff| {diff:.3g} (rtol {PREFIX_RTOL:g}); T=4 vs NumPy {numpy_diff:.3g}")


def closest_call(loop: HostLoop, ids: list[int]) -> str:
    """The smallest top-1 vs top-2 logit gap over the 32 decoded rows. One compiled forward
    of the final ids gives every step's row: row r depends only on ids 0..r (causality)."""
    logits = loop.logits_for(np.array([ids], dtype=np.int64))[0]
    rows = logits[len(PROMPT) - 1:len(PROMPT) - 1 + STEPS]
    top2 = np.sort(rows, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    step = int(np.argmin(gaps))
    return f"closest call: step {step}, top-1 vs top-2 gap {gaps[step]:.2g}"


def check_runs(report: Report, label: str, first: list[int], second: list[int],
               numpy_ids: list[int], vocab: tuple[str, ...], note: str = "") -> None:
    generated = first[len(PROMPT):]
    same = first == second
    matches = first == numpy_ids
    if same and matches:
        detail = f"{len(generated)} tokens; both runs == NumPy rollout"
        if note:
            detail += f"; {note}"
    else:
        where = next((i for i, (a, b) in enumerate(zip(first, numpy_ids, strict=True))
                      if a != b), None)
        detail = (f"runs agree: {same}; first difference from NumPy at index {where} "
                  f"(compiled {first[where] if where is not None else '-'} "
                  f"'{vocab[first[where]] if where is not None else ''}', NumPy "
                  f"{numpy_ids[where] if where is not None else '-'})")
    report.add(label, same and matches, detail)


def leak_result(before: np.ndarray, after: np.ndarray) -> tuple[bool, str]:
    """Rows 0..T-2 must be identical; the last row must change (else the test is vacuous)."""
    earlier = float(np.max(np.abs(before[:, :-1, :] - after[:, :-1, :])))
    last = float(np.max(np.abs(before[:, -1, :] - after[:, -1, :])))
    return earlier == 0.0 and last > 0.0, \
        f"rows 0..{before.shape[1] - 2} max |diff| {earlier:.3g}; row {before.shape[1] - 1} " \
        f"moved {last:.3g}"


def check_causal(report: Report, loop: HostLoop, ids: list[int],
                 checkpoint: fixture.Checkpoint) -> None:
    before_ids = np.array([ids], dtype=np.int64)
    after_ids = before_ids.copy()
    after_ids[0, -1] = (after_ids[0, -1] + 1) % checkpoint.widths.vocab_size
    change = f"id[{T - 1}] {before_ids[0, -1]} -> {after_ids[0, -1]}"

    compiled_before, compiled_after = loop.logits_for(before_ids), loop.logits_for(after_ids)
    passed, detail = leak_result(compiled_before, compiled_after)
    report.add("(d) causal non-leak, compiled", passed, f"{change}: {detail}")

    numpy_before = reference.forward_weights(before_ids, checkpoint)
    numpy_after = reference.forward_weights(after_ids, checkpoint)
    passed, detail = leak_result(numpy_before, numpy_after)
    agree = float(np.max(np.abs(compiled_before - numpy_before)))
    report.add("(d) causal non-leak, NumPy", passed,
               f"{detail}; compiled vs NumPy logits max |diff| {agree:.3g}")

    version = torch_version()
    if version is None:
        report.skip("(d) causal non-leak, PyTorch", "PyTorch is not installed")
        return
    torch_before = torch_logits(before_ids, checkpoint)
    torch_after = torch_logits(after_ids, checkpoint)
    passed, detail = leak_result(torch_before, torch_after)
    agree = float(np.max(np.abs(torch_before - numpy_before)))
    same_algebra = bool(np.allclose(torch_before, numpy_before, rtol=1e-5, atol=1e-6))
    report.add(f"(d) causal non-leak, PyTorch {version}", passed and same_algebra,
               f"{detail}; PyTorch vs NumPy logits max |diff| {agree:.3g}")


# ---- main -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Section 23: StoryLM-0 32-token rollout (greedy and sampled) through "
                    "tilegen-compiled code, checked against NumPy and PyTorch.")
    parser.add_argument("--jit", action="store_true",
                        help="compile in-process (MCJIT) instead of building .so files; "
                             "nothing is written to disk")
    parser.add_argument("--fixture", type=Path, default=fixture.DEFAULT_FIXTURE_DIR,
                        help="the StoryLM-0 fixture folder (default: fixtures/storylm0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kina_frontend import KinaError

    try:
        checkpoint = fixture.load_checkpoint(args.fixture)
        vocab = fixture.load_vocab(args.fixture)
    except fixture.FixtureError as error:
        print(f"validate_rollout: cannot load the fixture: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        with compiled_programs(args.jit) as (rollout_module, forward_module, where):
            compile_ms = (time.perf_counter() - started) * 1e3
            return validate(checkpoint, vocab, args.fixture, rollout_module, forward_module,
                            where, compile_ms)
    except KinaError as error:
        print(error.render(), file=sys.stderr)
        return 2


def validate(checkpoint: fixture.Checkpoint, vocab: tuple[str, ...], fixture_dir: Path,
             rollout_module, forward_module, where: str, compile_ms: float) -> int:
    report = Report()
    loop = HostLoop(rollout_module, checkpoint)
    print(f"StoryLM-0 rollout (Section 23): T = {T}, {STEPS} steps, compiled with tilegen "
          f"({where}; both programs in {compile_ms:.0f} ms)")
    print(f"fixture  {fixture_dir}  "
          f"({fixture.CHECKPOINT_FORMAT}, vocab {len(vocab)} tokens)")
    print(f"prompt   {list(PROMPT)}  \"{decode(list(PROMPT), vocab)}\"")

    check_prefix(report, loop, forward_module, checkpoint)

    started = time.perf_counter()
    greedy = loop.run("greedy")
    greedy_us = (time.perf_counter() - started) * 1e6 / STEPS
    greedy_again = loop.run("greedy")
    numpy_greedy = reference.rollout(PROMPT, checkpoint, steps=STEPS, T=T, mode="greedy")
    check_runs(report, "(b) greedy x2 == each other == NumPy", greedy, greedy_again,
               numpy_greedy, vocab, closest_call(loop, greedy))

    sampled = loop.run("sample")
    sampled_again = loop.run("sample")
    numpy_sampled = reference.rollout(PROMPT, checkpoint, steps=STEPS, T=T, mode="sample",
                                      rng_seed=SEED, temperature=TEMPERATURE)
    check_runs(report, f"(c) sampled x2 (RandomState({SEED}), T={TEMPERATURE}) == NumPy",
               sampled, sampled_again, numpy_sampled, vocab)

    check_causal(report, loop, greedy, checkpoint)

    print(f"greedy   {greedy}")
    print(f"         \"{decode(greedy, vocab)}\"")
    print(f"sampled  {sampled}")
    print(f"         \"{decode(sampled, vocab)}\"")
    print(f"host loop: {greedy_us:.1f} us per greedy step (forward + decode, buffers reused)")
    print()
    print(report.table('validate_rollout'))
    return 1 if report.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
