#!/usr/bin/env python3
"""Section 24 validation: the StoryLM-0 host train loop through tilegen-compiled code.

    python scripts/validate_train.py            # examples compiled to .so files (removed after)
    python scripts/validate_train.py --jit      # in-process JIT; writes nothing to disk
    python scripts/validate_train.py --jit --plot loss.png --save trained/

The host loop runs `storylm0_nll_step` (examples/storylm0_nll_step.kina: sum-NLL,
reverseMode over the six weights, SGD inside Kina) for 40 epochs over the three corpus
windows, then rolls out greedily with `storylm0_rollout` + `greedy_row`
(examples/storylm0_rollout.kina, T = 36). Checks, each on numbers computed by the
compiled code, against NumPy (storylm.reference, hand-derived gradients) and PyTorch
(autograd) when it is importable:

  (a) the first step's weight updates match the NumPy SGD step (and PyTorch's);
  (b) the corpus sum-NLL after the epochs is below 0.5 and below its initial value;
  (c) greedy from [1, 2, 3, 4] gives [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6] first and the
      same ids as the NumPy rollout;
  (d) on the trained T = 36 forward, changing the last id leaves every earlier logit row
      unchanged (compiled, NumPy, PyTorch).

Prints a PASS/FAIL table; exits 1 when any check fails, 2 on bad usage or when the fixture
(--fixture, default fixtures/storylm0) or the examples cannot be loaded or compiled, or an
output cannot be written, and 130 on Ctrl-C. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# A source checkout, or the installed package (tilegen/scripts, next to tilegen/examples).
REPO = Path(__file__).resolve().parents[1]
if (REPO / "storylm").is_dir() and str(REPO) not in sys.path:  # a checkout, not installed
    sys.path.insert(0, str(REPO))

from storylm import fixture, reference  # noqa: E402
from storylm.checks import Report  # noqa: E402

NLL_STEP_EXAMPLE = REPO / "examples" / "storylm0_nll_step.kina"
ROLLOUT_EXAMPLE = REPO / "examples" / "storylm0_rollout.kina"

EPOCHS = 40
LEARNING_RATE = 0.1
NLL_LIMIT = 0.5
PROMPT = (1, 2, 3, 4)
LOCKED_CYCLE = (1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6)
ROLLOUT_T = reference.ROLLOUT_LENGTH  # 36
ROLLOUT_STEPS = reference.ROLLOUT_STEPS  # 32
# The compiled step is float32 like the NumPy reference; both differ only by rounding.
UPDATE_RTOL = 1e-4  # relative to the largest update of a weight
UPDATE_ATOL = 1e-7
TORCH_DTYPE_NAME = "float64"  # PyTorch recomputes the step exactly, as a second opinion


# ---- results ------------------------------------------------------------------------------

# ---- compiled programs --------------------------------------------------------------------

@dataclass
class Programs:
    nll_step: Callable
    nll: Callable
    rollout: Callable
    greedy_row: Callable
    kind: str


@contextlib.contextmanager
def compiled_programs(jit: bool) -> Iterator[Programs]:
    """Compile both examples: in-process JIT, or .so files in a temporary folder that is
    removed on the way out (also on Ctrl-C or an error)."""
    import tilegen
    from tilegen.staging import temporary_directory

    started = time.perf_counter()
    if jit:
        step_module = tilegen.compile_file(NLL_STEP_EXAMPLE, jit=True)
        rollout_module = tilegen.compile_file(ROLLOUT_EXAMPLE, jit=True)
        _report_compile("JIT (in-process, nothing written)", started)
        yield _programs(step_module, rollout_module, "jit")
        return
    with temporary_directory("validate-train-") as folder:
        step_path = os.path.join(folder, "storylm0_nll_step.so")
        rollout_path = os.path.join(folder, "storylm0_rollout.so")
        step_module = tilegen.compile_file(NLL_STEP_EXAMPLE, jit=False, output=step_path)
        rollout_module = tilegen.compile_file(ROLLOUT_EXAMPLE, jit=False, output=rollout_path)
        _report_compile(f"shared libraries in {folder} (removed at exit)", started)
        yield _programs(step_module, rollout_module, "so")


def _programs(step_module, rollout_module, kind: str) -> Programs:
    return Programs(step_module.storylm0_nll_step, step_module.storylm0_nll,
                    rollout_module.storylm0_rollout, rollout_module.greedy_row, kind)


def _report_compile(how: str, started: float) -> None:
    elapsed = time.perf_counter() - started
    print(f"compiled {NLL_STEP_EXAMPLE.name} and {ROLLOUT_EXAMPLE.name}: {how}, "
          f"{elapsed:.2f} s")


# ---- the host loop ------------------------------------------------------------------------

# (token_ids, targets, embed, wq, wk, wv, wo, lm_head, causal_mask, scale)
StepArguments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                      np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def step_arguments(weights: dict[str, np.ndarray], window: fixture.Window,
                   mask: np.ndarray) -> StepArguments:
    """storylm0_nll_step's arguments without lr:
    (token_ids, targets, embed, wq, wk, wv, wo, lm_head, causal_mask, scale)."""
    return (window.id_array(), window.target_array(), weights["embed"], weights["wq"],
            weights["wk"], weights["wv"], weights["wo"], weights["lm_head"], mask,
            weights["scale"])


def compiled_step(programs: Programs, weights, window, mask, lr) -> tuple[float, dict]:
    nll, *updated = programs.nll_step(*step_arguments(weights, window, mask), lr)
    new_weights = dict(weights)
    new_weights.update(zip(fixture.TRAINABLE_NAMES, updated, strict=True))
    return float(nll), new_weights


def compiled_corpus_nll(programs: Programs, weights, corpus, mask) -> float:
    """Sum over the windows of the compiled storylm0_nll (float32 each, summed in float64)."""
    return float(sum(float(programs.nll(*step_arguments(weights, window, mask)))
                     for window in corpus))


def progress(epochs: int):
    """A tqdm bar over epochs on stderr, or plain lines when tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        class _Plain:
            def __init__(self, total):
                self.total = total
                self.done = 0

            def update(self, nll: float) -> None:
                self.done += 1
                if self.done % 10 == 0 or self.done == self.total:
                    print(f"  epoch {self.done}/{self.total}: corpus NLL {nll:.4f}",
                          file=sys.stderr)

            def close(self) -> None:
                pass
        return _Plain(epochs)

    class _Bar:
        def __init__(self, total):
            self.bar = tqdm(total=total, desc="train", unit="epoch", file=sys.stderr,
                            dynamic_ncols=True)

        def update(self, nll: float) -> None:
            self.bar.set_postfix(nll=f"{nll:.4f}", refresh=False)
            self.bar.update(1)

        def close(self) -> None:
            self.bar.close()
    return _Bar(epochs)


def train(programs: Programs, weights, corpus, mask, epochs: int,
          lr: np.ndarray) -> tuple[dict, list[float]]:
    """Section 24 loop; returns the trained weights and the corpus NLL at init and after
    each epoch (all from compiled code)."""
    history = [compiled_corpus_nll(programs, weights, corpus, mask)]
    bar = progress(epochs)
    try:
        for _ in range(epochs):
            for window in corpus:
                _, weights = compiled_step(programs, weights, window, mask, lr)
            history.append(compiled_corpus_nll(programs, weights, corpus, mask))
            bar.update(history[-1])
    finally:
        bar.close()
    return weights, history


def compiled_rollout(programs: Programs, weights, prompt, steps: int) -> tuple[list[int],
                                                                               np.ndarray]:
    """Section 23 host loop on the compiled T = 36 forward and greedy_row: the token buffer
    [1, 36] padded with 0; step s reads logits[:, P-1+s, :] and writes token P+s."""
    tokens = np.full((1, ROLLOUT_T), fixture.PAD_ID, dtype=np.int64)
    tokens[0, :len(prompt)] = prompt
    mask = fixture.causal_mask(ROLLOUT_T)
    for step in range(steps):
        logits = rollout_logits(programs, weights, tokens, mask)
        read = len(prompt) - 1 + step
        tokens[0, read + 1] = int(programs.greedy_row(logits[:, read:read + 1, :])[0, 0])
    return tokens[0, :len(prompt) + steps].tolist(), tokens


def rollout_logits(programs: Programs, weights, tokens, mask) -> np.ndarray:
    return programs.rollout(tokens, weights["embed"], mask, weights["scale"], weights["wq"],
                            weights["wk"], weights["wv"], weights["wo"], weights["lm_head"])


# ---- PyTorch, the second reference --------------------------------------------------------

def import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_forward(torch, tokens: np.ndarray, weights, mask: np.ndarray):
    """The brief's forward algebra, written in PyTorch (float64)."""
    dtype = getattr(torch, TORCH_DTYPE_NAME)
    t = {name: (value if isinstance(value, torch.Tensor) else
                torch.tensor(np.asarray(value), dtype=dtype)) for name, value in weights.items()}
    ids = torch.tensor(tokens, dtype=torch.int64)
    length = tokens.shape[1]
    heads, head_dim = fixture.WIDTHS.heads, fixture.WIDTHS.head_dim
    width = heads * head_dim

    def split(projected):
        return projected.reshape(1, length, heads, head_dim).permute(0, 2, 1, 3)

    x = t["embed"][ids]
    q, k, v = split(x @ t["wq"]), split(x @ t["wk"]), split(x @ t["wv"])
    scores = q @ k.transpose(2, 3) * t["scale"] + torch.tensor(mask, dtype=dtype)
    attended = (torch.softmax(scores, dim=3) @ v).permute(0, 2, 1, 3).reshape(1, length, width)
    return (x + attended @ t["wo"]) @ t["lm_head"]


def torch_sgd_step(torch, weights, window: fixture.Window, mask, lr: float) -> dict:
    dtype = getattr(torch, TORCH_DTYPE_NAME)
    params = {name: torch.tensor(np.asarray(weights[name]), dtype=dtype, requires_grad=True)
              for name in fixture.TRAINABLE_NAMES}
    inputs = dict(params, scale=torch.tensor(np.asarray(weights["scale"]), dtype=dtype))
    logits = torch_forward(torch, window.id_array(), inputs, mask)
    targets = torch.tensor(window.target_array(), dtype=torch.int64)
    log_probs = torch.log_softmax(logits, dim=2)
    nll = -log_probs.gather(2, targets.unsqueeze(2)).sum()
    nll.backward()
    with torch.no_grad():
        return {name: (params[name] - lr * params[name].grad).numpy()
                for name in fixture.TRAINABLE_NAMES}


# ---- the checks ---------------------------------------------------------------------------

def update_error(before, after, expected) -> tuple[float, float]:
    """(worst error of the update w' - w over the six weights relative to tolerance, the
    largest update) -- error / (atol + rtol * max |update|) <= 1 passes."""
    worst, largest = 0.0, 0.0
    for name in fixture.TRAINABLE_NAMES:
        got = np.asarray(after[name], np.float64) - np.asarray(before[name], np.float64)
        want = np.asarray(expected[name], np.float64) - np.asarray(before[name], np.float64)
        scale = float(np.max(np.abs(want)))
        largest = max(largest, scale)
        error = float(np.max(np.abs(got - want)))
        worst = max(worst, error / (UPDATE_ATOL + UPDATE_RTOL * scale))
    return worst, largest


def check_first_step(report: Report, programs: Programs, weights, corpus, mask, lr, torch):
    window = corpus[0]
    nll, updated = compiled_step(programs, weights, window, mask, lr)
    args = step_arguments(weights, window, mask)
    ref_nll, *ref_updated = reference.nll_step(*args, lr)
    expected = dict(zip(fixture.TRAINABLE_NAMES, ref_updated, strict=True))
    ratio, largest = update_error(weights, updated, expected)
    nll_ok = abs(nll - float(ref_nll)) <= 1e-5 * max(1.0, abs(float(ref_nll)))
    report.add("(a) first step: weight updates match NumPy SGD", ratio <= 1.0 and nll_ok,
               f"err/tol {ratio:.3f}, largest update {largest:.3g}; nll {nll:.6f} vs "
               f"NumPy {float(ref_nll):.6f}")
    if torch is None:
        report.skip("(a) first step: weight updates match PyTorch", "torch is not importable")
        return
    torch_updated = torch_sgd_step(torch, weights, window, mask, float(lr[0, 0]))
    ratio, _ = update_error(weights, updated, torch_updated)
    report.add("(a) first step: weight updates match PyTorch", ratio <= 1.0,
               f"err/tol {ratio:.3f} (autograd in {TORCH_DTYPE_NAME})")


def check_training(report: Report, history: list[float], reference_history: list[float],
                   epochs: int) -> None:
    init, final = history[0], history[-1]
    report.add(f"(b) corpus NLL after {epochs} epochs < {NLL_LIMIT} and below init",
               final < NLL_LIMIT and final < init, f"init {init:.4f} -> final {final:.4f}")
    ref_final = reference_history[-1]
    close = abs(final - ref_final) <= 1e-3 * max(ref_final, 1e-3) + 1e-4
    report.add("(b) NLL trajectory matches NumPy training", close and
               abs(init - reference_history[0]) <= 1e-4 * reference_history[0],
               f"compiled {init:.6f} -> {final:.6f}, NumPy {reference_history[0]:.6f} -> "
               f"{ref_final:.6f}")


def check_rollout(report: Report, programs: Programs, weights) -> np.ndarray:
    ids, tokens = compiled_rollout(programs, weights, PROMPT, ROLLOUT_STEPS)
    first = tuple(ids[:len(LOCKED_CYCLE)])
    report.add("(c) greedy from [1, 2, 3, 4] gives the locked cycle", first == LOCKED_CYCLE,
               f"first {len(first)}: {list(first)}")
    numpy_ids = reference.rollout(list(PROMPT), weights, steps=ROLLOUT_STEPS, T=ROLLOUT_T)
    same = ids == numpy_ids
    detail = f"all {len(ids)} ids equal" if same else f"compiled {ids} vs NumPy {numpy_ids}"
    report.add("(c) greedy ids match the NumPy rollout", same, detail)
    return tokens


def check_causal(report: Report, programs: Programs, weights, tokens: np.ndarray, torch):
    """Changing the last id must leave all earlier logit rows unchanged (exactly: masked
    scores have probability exactly 0), and must change the last row (not vacuous)."""
    mask = fixture.causal_mask(ROLLOUT_T)
    changed = tokens.copy()
    changed[0, -1] = (changed[0, -1] % (fixture.WIDTHS.vocab_size - 1)) + 1

    def verdict(before: np.ndarray, after: np.ndarray) -> tuple[bool, str]:
        earlier = float(np.max(np.abs(after[:, :-1] - before[:, :-1])))
        last = float(np.max(np.abs(after[:, -1] - before[:, -1])))
        return earlier == 0.0 and last > 0.0, (f"earlier rows max |diff| {earlier:.1e}, "
                                               f"last row {last:.2e}")

    compiled_before = rollout_logits(programs, weights, tokens, mask)
    compiled_after = rollout_logits(programs, weights, changed, mask)
    ok, detail = verdict(compiled_before, compiled_after)
    report.add("(d) causal non-leak on the trained T=36 forward (compiled)", ok,
               f"last id {tokens[0, -1]} -> {changed[0, -1]}: {detail}")
    numpy_before = reference.forward_weights(tokens, weights)
    numpy_after = reference.forward_weights(changed, weights)
    ok, detail = verdict(numpy_before, numpy_after)
    agree = float(np.max(np.abs(compiled_before - numpy_before)))
    report.add("(d) causal non-leak, same algebra in NumPy", ok and agree < 1e-4,
               f"{detail}; compiled vs NumPy logits {agree:.1e}")
    if torch is None:
        report.skip("(d) causal non-leak, same algebra in PyTorch", "torch is not importable")
        return
    with torch.no_grad():
        torch_before = torch_forward(torch, tokens, weights, mask).numpy()
        torch_after = torch_forward(torch, changed, weights, mask).numpy()
    ok, detail = verdict(torch_before, torch_after)
    report.add("(d) causal non-leak, same algebra in PyTorch", ok, detail)


# ---- outputs ------------------------------------------------------------------------------

def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("validate_train.py: --plot needs matplotlib, which is not installed "
                         "(pip install 'tilegen[plot]' or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plot(plt, path: Path, history: list[float], reference_history: list[float]) -> None:
    """The loss curve as a PNG, written to a temporary name and renamed into place."""
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    try:
        axes.plot(range(len(history)), history, label="tilegen (compiled)", linewidth=2)
        axes.plot(range(len(reference_history)), reference_history, "--",
                  label="NumPy reference", linewidth=1)
        axes.axhline(NLL_LIMIT, color="grey", linewidth=0.8, linestyle=":")
        axes.set_yscale("log")
        axes.set_xlabel("epoch")
        axes.set_ylabel("corpus sum-NLL")
        axes.set_title("StoryLM-0 training (Section 24)")
        axes.legend()
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                                 suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                figure.savefig(handle, format="png")
            os.chmod(temp_name, 0o644)  # mkstemp makes 0600; a plot is an ordinary file
            os.replace(temp_name, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_name)
            raise
    finally:
        plt.close(figure)


def save_weights(directory: Path, weights, corpus) -> None:
    trained = {name: np.ascontiguousarray(weights[name], dtype=np.float32)
               for name in fixture.CHECKPOINT_NAMES}
    fixture.save_checkpoint(directory, trained, corpus=corpus)
    reloaded = fixture.load_checkpoint(directory)  # the validating loader reads it back
    for name in fixture.CHECKPOINT_NAMES:
        if not np.array_equal(getattr(reloaded, name), trained[name]):
            raise RuntimeError(f"{directory}: '{name}' did not read back bit for bit")


# ---- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Section 24: train StoryLM-0 with the compiled storylm0_nll_step and "
                    "check it against NumPy (and PyTorch when installed).")
    parser.add_argument("--jit", action="store_true",
                        help="compile in-process (default: .so files in a temporary folder)")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="write the loss curve to this PNG (needs matplotlib)")
    parser.add_argument("--save", type=Path, metavar="DIR",
                        help="write the trained weights to DIR as a storylm0 fixture")
    parser.add_argument("--epochs", type=int, default=EPOCHS,
                        help=f"epochs over the three windows (default {EPOCHS})")
    parser.add_argument("--fixture", type=Path, default=fixture.DEFAULT_FIXTURE_DIR,
                        metavar="DIR", help="the StoryLM-0 fixture folder (default: "
                                            "fixtures/storylm0)")
    args = parser.parse_args(argv)
    if args.epochs < 0:
        parser.error("--epochs must be >= 0")
    for option, path, is_dir in (("--save", args.save, True), ("--plot", args.plot, False)):
        problem = path is not None and unwritable(path, is_dir)
        if problem:
            parser.error(f"{option} {path}: {problem}")
    return args


def unwritable(path: Path, is_dir: bool) -> str:
    """Why `path` cannot be written (checked before training, so a typo costs no run), or ''.
    Missing folders are fine: they are created when the output is written."""
    if path.exists() and path.is_dir() != is_dir:
        return "is a directory" if path.is_dir() else "exists and is not a directory"
    parent = path if is_dir else path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return ""


def run(args: argparse.Namespace) -> int:
    plt = require_matplotlib() if args.plot else None
    checkpoint = fixture.load_checkpoint(args.fixture)
    corpus = fixture.load_corpus(args.fixture)
    weights = checkpoint.arrays()
    window_length = len(corpus[0].ids)
    mask = fixture.causal_mask(window_length)
    lr = np.full((1, 1), LEARNING_RATE, dtype=np.float32)
    torch = import_torch()
    print(f"fixture {args.fixture} ({len(corpus)} windows of {window_length} "
          f"tokens); PyTorch: {'yes, ' + torch.__version__ if torch else 'not installed'}")
    report = Report()
    with compiled_programs(args.jit) as programs:
        check_first_step(report, programs, weights, corpus, mask, lr, torch)
        started = time.perf_counter()
        trained, history = train(programs, weights, corpus, mask, args.epochs, lr)
        elapsed = time.perf_counter() - started
        steps = args.epochs * len(corpus)
        print(f"trained {args.epochs} epochs x {len(corpus)} windows = {steps} compiled steps "
              f"in {elapsed:.3f} s; corpus sum-NLL {history[0]:.4f} (init) -> "
              f"{history[-1]:.4f} (final)")
        numpy_run = reference.train(checkpoint, corpus, epochs=args.epochs, lr=LEARNING_RATE)
        print(f"NumPy reference training: {numpy_run.nll_history[0]:.4f} -> "
              f"{numpy_run.nll_history[-1]:.4f}")
        check_training(report, history, numpy_run.nll_history, args.epochs)
        tokens = check_rollout(report, programs, trained)
        check_causal(report, programs, trained, tokens, torch)
    if args.plot:
        write_plot(plt, args.plot, history, numpy_run.nll_history)
        print(f"wrote {args.plot}")
    if args.save:
        save_weights(args.save, trained, corpus)
        print(f"wrote trained weights to {args.save}")
    print()
    print(report.table('validate_train'))
    return 1 if report.failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kina_frontend import KinaError

    try:
        return run(args)
    except KeyboardInterrupt:
        print("\nvalidate_train: interrupted (no partial files left behind)", file=sys.stderr)
        return 130
    except fixture.FixtureError as error:
        print(f"validate_train: cannot load the fixture: {error}", file=sys.stderr)
        return 2
    except KinaError as error:
        print(error.render(), file=sys.stderr)
        return 2
    except OSError as error:  # writing --save or --plot (the fixture's errors are above)
        where = f" {error.filename}" if error.filename else ""
        print(f"validate_train: cannot write{where}: {error.strerror or error}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
