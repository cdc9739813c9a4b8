"""The CLI's code-generation stages: --emit loops/llvm/asm, -o OUT.so, --run."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_emit_llvm_has_vector_ops_in_hot_loops():
    result = _cli("storylm0_forward.kina", "--emit", "llvm")
    assert result.returncode == 0, result.stderr
    vector_ops = re.findall(r"= (?:fmul|fadd|call|load)[^\n]*<(?:16|8) x float>", result.stdout)
    assert len(vector_ops) > 10


def test_emit_loops_and_asm():
    loops = _cli("storylm0_rollout.kina", "--emit", "loops", "--function", "storylm0_rollout")
    assert loops.returncode == 0, loops.stderr
    assert "kernel @storylm0_rollout" in loops.stdout and "vector<16>" in loops.stdout
    asm = _cli("storylm0_forward.kina", "--emit", "asm", "--function", "storylm0_forward")
    assert asm.returncode == 0, asm.stderr
    assert "zmm" in asm.stdout or "ymm" in asm.stdout


def test_output_shared_library(tmp_path):
    target = tmp_path / "forward.so"
    result = _cli("storylm0_forward.kina", "-o", str(target))
    assert result.returncode == 0, result.stderr
    library = ctypes.CDLL(str(target))
    assert library.kina_storylm0_forward
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward.so"]


def test_run_main_is_deterministic():
    first = _cli("storylm0_rollout.kina", "--run")
    second = _cli("storylm0_rollout.kina", "--run")
    assert first.returncode == 0, first.stderr
    checksums = [line for line in first.stdout.splitlines() if "crc32=" in line]
    assert [line.split("crc32=")[1] for line in checksums] == \
        [line.split("crc32=")[1] for line in second.stdout.splitlines() if "crc32=" in line]
    assert any(line.strip().startswith("logits: f32[1, 36, 8]") for line in checksums)


def test_unknown_function_is_a_diagnostic():
    result = _cli("storylm0_forward.kina", "--emit", "loops", "--function", "nope")
    assert result.returncode == 1
    assert "no function 'nope'" in result.stderr and "Traceback" not in result.stderr


# ---- --run ends in a diagnostic, never a traceback (issue 17, item 4) ---------------------

def test_run_computed_id_out_of_range_is_a_diagnostic_at_the_op(tmp_path):
    source = tmp_path / "computed.kina"
    source.write_text("@main\nfn main() {\n"
                      "  let table = placeholder(Tensor[F32, [8, 4], @host]);\n"
                      "  let ids = placeholder(Tensor[I64, [2, 3], @host]);\n"
                      "  let y = gather(table, ids * 2);\n}\n")
    result = _cli(str(source), "--run")
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{source}:5:11: error[K900]: @main: 'gather' id "), first
    assert "of a computed ids tensor is out of range [0, 8)" in first


def test_run_negative_seed_is_a_diagnostic(tmp_path):
    result = _cli("storylm0_forward.kina", "--run", "--seed", "-5")
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert re.match(r"\S+storylm0_forward\.kina:\d+:\d+: error\[K900\]: --seed -5 gives "
                    r"placeholder 0 the NumPy seed -5", result.stderr), result.stderr


def test_run_draws_scatter_add_ids_below_its_rows(tmp_path):
    """--run's ids come from each op's `ids_bound`: a scatter_add into 3 rows gets ids in
    [0, 3) (it got [0, 8) and failed). The printed sum is recomputed with NumPy from the
    documented draws."""
    import numpy as np

    source = tmp_path / "scatter.kina"
    source.write_text("@main\nfn main() {\n"
                      "  let u = placeholder(Tensor[F32, [6, 4], @host]);\n"
                      "  let ids = placeholder(Tensor[I64, [6], @host]);\n"
                      "  let y = scatter_add(u, ids, 3);\n}\n")
    result = _cli(str(source), "--run", "--seed", "11")
    assert result.returncode == 0, result.stderr
    u = np.random.default_rng(11).standard_normal((6, 4)).astype(np.float32)
    ids = np.random.default_rng(12).integers(0, 3, size=6, dtype=np.int64)
    expected = np.zeros((3, 4), np.float32)
    np.add.at(expected, ids, u)
    (line,) = [line for line in result.stdout.splitlines() if line.strip().startswith("y:")]
    total = float(line.split("sum=")[1].split()[0])
    assert abs(total - float(expected.sum(dtype=np.float64))) < 1e-5


def test_id_limits_come_from_every_id_reading_op():
    from kina_frontend import program_from_text
    from kina_frontend.ops import REGISTRY
    from tilegen.run_inputs import id_limits

    assert sorted(n for n, d in REGISTRY.items() if d.ids_bound) == \
        ["gather", "one_hot", "scatter_add"]
    program = program_from_text(
        "fn f(t: Tensor[F32, [9, 2], @host], u: Tensor[F32, [4, 2], @host],\n"
        "     a: Tensor[I64, [4], @host], b: Tensor[I64, [4], @host],\n"
        "     c: Tensor[I64, [4], @host])\n"
        "    -> (Tensor[F32, [4, 2], @host], Tensor[F32, [5, 2], @host],\n"
        "        Tensor[F32, [4, 6], @host], Tensor[F32, [4, 2], @host]) {\n"
        "  return (gather(t, a), scatter_add(u, b, 5), one_hot(c, 6), gather(t, c));\n}\n")
    assert id_limits(program.function("f")) == {"a": 9, "b": 5, "c": 6}


def test_run_out_of_memory_is_a_diagnostic(monkeypatch, capsys):
    """A MemoryError while --run makes the placeholders or runs @main ends as K900 at the
    @main (simulated: a real one would take the machine's memory)."""
    from tilegen import cli_actions
    from tilegen import compile as cli

    def no_memory(*args, **kwargs):
        raise MemoryError("simulated")

    monkeypatch.setattr(cli_actions, "placeholder_values", no_memory)
    assert cli.main(["storylm0_forward.kina", "--run"]) == 1
    error = capsys.readouterr().err
    assert re.match(r"\S+storylm0_forward\.kina:\d+:\d+: error\[K900\]: @main: not enough "
                    r"memory for its placeholder values", error), error
