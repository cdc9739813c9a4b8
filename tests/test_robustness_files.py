"""Files in and out: damaged inputs give one clear line naming the file (and key); outputs
appear whole or not at all, also when the run is interrupted.

Inputs: damaged fixtures through the validate scripts' command lines (exit 2, the file and
key in one line on stderr, no traceback), odd fixture files for the loader (directories,
/dev/zero, zip bombs, unreadable files), and unreadable .kina paths through
`python -m tilegen.compile` and `tilegen.compile_file`.

Outputs: `validate_train.py --jit --save DIR` interrupted by SIGINT mid-training and by a
Ctrl-C injected at every write step of the save, `--plot` interrupted mid-write, `python -m
tilegen.compile -o` interrupted by SIGINT during the link, and the on-disk compile cache
interrupted mid-write: no half-written file, no temporary left behind, an existing output
unchanged.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kina_frontend import KinaError
from storylm import fixture
from tests.test_storylm_fixture import CORPUS_CORRUPTIONS, CORRUPTIONS

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "scripts" / "validate_train.py"
ROLLOUT = REPO / "scripts" / "validate_rollout.py"
COMMITTED = REPO / "fixtures" / "storylm0"
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and devices")


def _run(command: list[str], cwd: Path, env: dict | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def _fixture_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "storylm0"
    shutil.copytree(COMMITTED, folder)
    return folder


def _leftovers(folder: Path) -> list[str]:
    """Temporary files the writers use: `.name.*.tmp`, `.tilegen-*`, `.tmp-*`."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.name.startswith(".") and (p.name.endswith(".tmp") or "tilegen-" in
                                                 p.name or p.name.startswith(".tmp-")))


# ---- damaged fixtures through the validate scripts' command lines ---------------------------

CLI_CASES = ("truncated npz", "flipped byte in npz data", "missing array", "wrong shape",
             "wrong dtype", "manifest format tag", "manifest missing key",
             "missing checkpoint file", "vocab format tag", "pickled object array")


@pytest.mark.parametrize(("script", "kind"), [
    *((script, kind) for kind in CLI_CASES for script in (TRAIN, ROLLOUT)),
    (TRAIN, "corpus format tag"),  # validate_rollout does not read the corpus
], ids=lambda value: value.stem if isinstance(value, Path) else value)
def test_validate_scripts_reject_a_damaged_fixture(tmp_path, script, kind):
    corrupt, file_name, key, text = {**CORRUPTIONS, **CORPUS_CORRUPTIONS}[kind]
    folder = _fixture_copy(tmp_path)
    corrupt(folder)
    result = _run([sys.executable, str(script), "--jit", "--fixture", str(folder)], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert str(folder / file_name) in lines[0] and text in lines[0], lines[0]
    if key is not None:
        assert f"key {key!r}" in lines[0]
    assert "PASS" not in result.stdout


@pytest.mark.parametrize("script", [TRAIN, ROLLOUT], ids=["validate_train", "validate_rollout"])
def test_validate_scripts_with_a_missing_or_wrong_fixture_folder(tmp_path, script):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    for folder in (tmp_path / "missing", not_a_folder):
        result = _run([sys.executable, str(script), "--jit", "--fixture", str(folder)], tmp_path)
        assert result.returncode == 2, result.stderr
        assert str(folder / "manifest.json") in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("option", "target", "message"), [
    ("--save", "afile", "exists and is not a directory"),
    ("--save", "afile/sub", "is not a directory"),
    ("--plot", ".", "is a directory"),
    ("--plot", "afile/loss.png", "is not a directory"),
])
def test_validate_train_rejects_unwritable_outputs_before_training(tmp_path, option, target,
                                                                   message):
    (tmp_path / "afile").write_text("x")
    result = _run([sys.executable, str(TRAIN), "--jit", option, str(tmp_path / target)],
                  tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "compiled" not in result.stdout  # refused before any work


# ---- odd files for the fixture loader -------------------------------------------------------

def test_a_directory_in_place_of_a_fixture_file(tmp_path):
    for name in ("checkpoint.npz", "manifest.json", "vocab.json"):
        folder = _fixture_copy(tmp_path / name)
        (folder / name).unlink()
        (folder / name).mkdir()
        with pytest.raises(fixture.FixtureError, match=f"{name}: cannot read file: Is a dir"):
            fixture.load_checkpoint(folder)


@POSIX
def test_a_device_in_place_of_the_checkpoint_is_not_read_forever(tmp_path):
    folder = _fixture_copy(tmp_path)
    (folder / "checkpoint.npz").unlink()
    (folder / "checkpoint.npz").symlink_to("/dev/zero")
    with pytest.raises(fixture.FixtureError, match="checkpoint.npz: larger than the"):
        fixture.load_checkpoint(folder)


def test_a_zip_bomb_member_is_refused_before_unpacking(tmp_path):
    """A 1 MB archive whose wq.npy unpacks to 1 GiB: refused from the header, no MemoryError."""
    folder = _fixture_copy(tmp_path)
    with zipfile.ZipFile(folder / "checkpoint.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in fixture.patterned_arrays().items():
            with archive.open(f"{name}.npy", "w", force_zip64=(name == "wq")) as stream:
                if name != "wq":
                    np.lib.format.write_array(stream, array)
                    continue
                for _ in range(64):
                    stream.write(bytes(1 << 24))
    assert (folder / "checkpoint.npz").stat().st_size < 2 * 2**20
    with pytest.raises(fixture.FixtureError) as info:
        fixture.load_checkpoint(folder)
    assert info.value.key == "wq" and "unpacks to 1073741824 bytes" in str(info.value)


def _unprivileged() -> list[str] | None:
    """A command prefix under which file permissions apply (root bypasses them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all"]


@POSIX
def test_unreadable_files_are_clear_errors(tmp_path):
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    folder = _fixture_copy(tmp_path)
    (folder / "checkpoint.npz").chmod(0)
    program = tmp_path / "locked.kina"
    program.write_text("fn f() {}\n")
    program.chmod(0)
    try:
        train = _run(prefix + [sys.executable, str(TRAIN), "--jit", "--fixture", str(folder)],
                     tmp_path)
        compile_cli = _run(prefix + [sys.executable, "-m", "tilegen.compile", str(program)],
                           tmp_path)
    finally:
        (folder / "checkpoint.npz").chmod(0o644)
        program.chmod(0o644)
    assert train.returncode == 2, train.stderr
    assert f"{folder / 'checkpoint.npz'}: cannot read file: Permission denied" in train.stderr
    assert compile_cli.returncode == 1, compile_cli.stderr
    assert compile_cli.stderr.strip() == \
        f"error[K600]: cannot read '{program}': Permission denied"


# ---- unreadable .kina paths -----------------------------------------------------------------

def _odd_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, fragment of the K600 message)."""
    (tmp_path / "afile.kina").write_text("fn f() {}\n")
    (tmp_path / "folder.kina").mkdir()
    loop = tmp_path / "loop.kina"
    loop.symlink_to(loop)
    (tmp_path / "dangling.kina").symlink_to(tmp_path / "nowhere.kina")
    return {
        "missing": (str(tmp_path / "missing.kina"), "No such file or directory"),
        "a directory": (str(tmp_path / "folder.kina"), "is a directory"),
        "through a file": (str(tmp_path / "afile.kina" / "x.kina"), "Not a directory"),
        "symlink loop": (str(loop), "Too many levels of symbolic links"),
        "dangling symlink": (str(tmp_path / "dangling.kina"), "No such file or directory"),
        "name too long": (str(tmp_path / ("x" * 300 + ".kina")), "File name too long"),
        "/dev/zero": ("/dev/zero", "more than the limit of"),
    }


@POSIX
def test_odd_kina_paths_through_the_cli(tmp_path):
    for label, (path, fragment) in _odd_paths(tmp_path).items():
        result = _run([sys.executable, "-m", "tilegen.compile", path], tmp_path, timeout=60)
        assert result.returncode == 1, (label, result.stderr)
        assert result.stderr.startswith("error[K600]: ") and fragment in result.stderr, label
        assert path in result.stderr and "Traceback" not in result.stderr, label


@POSIX
def test_odd_kina_paths_through_the_api(tmp_path):
    import tilegen

    paths = _odd_paths(tmp_path)
    paths["nul byte"] = (str(tmp_path / "a\x00b.kina"), "contains a NUL byte")
    for label, (path, fragment) in paths.items():
        with pytest.raises(KinaError) as info:
            tilegen.compile_file(path)
        assert info.value.code == "K600" and fragment in info.value.message, label


def test_non_utf8_and_empty_files(tmp_path):
    import tilegen

    (tmp_path / "latin1.kina").write_bytes("// caf\u00e9\nfn f() {}\n".encode("latin-1"))
    result = _run([sys.executable, "-m", "tilegen.compile", "latin1.kina"], tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("latin1.kina:1:7: error[K100]: invalid UTF-8 byte 0xe9")
    (tmp_path / "empty.kina").write_bytes(b"")
    assert tilegen.program_of(tilegen.compile_file(tmp_path / "empty.kina")).plans == {}


# ---- outputs: interrupted runs leave whole files or nothing ---------------------------------

class _Reader(threading.Thread):
    """Collects a pipe's lines while the process runs."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.lines = stream, []
        self.start()

    def run(self):
        for line in self.stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


def _wait_for(condition, timeout: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


@POSIX
@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "over-old-checkpoint"])
def test_sigint_mid_training_leaves_no_partial_save(tmp_path, existing):
    temp = tmp_path / "tmp"
    temp.mkdir()
    save = tmp_path / "trained"
    if existing:
        shutil.copytree(COMMITTED, save)
    before = {p.name: p.read_bytes() for p in save.iterdir()} if existing else None
    process = subprocess.Popen(
        [sys.executable, str(TRAIN), "--jit", "--epochs", "1000000", "--save", str(save)],
        cwd=tmp_path, env={**ENV, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    out, err = _Reader(process.stdout), _Reader(process.stderr)
    try:
        assert _wait_for(lambda: "compiled " in out.text() or process.poll() is not None, 120)
        assert process.poll() is None, out.text() + err.text()
        time.sleep(1.0)  # inside the million-epoch loop
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130, out.text() + err.text()
    finally:
        if process.poll() is None:
            process.kill()
    out.join(5)
    err.join(5)
    assert "trained " not in out.text()  # interrupted during training
    assert "interrupted" in err.text() and "Traceback" not in err.text()
    if existing:
        assert {p.name: p.read_bytes() for p in save.iterdir()} == before
    else:
        assert not save.exists()
    assert list(temp.iterdir()) == []


SAVE_INTERRUPTIONS = r"""
import json, os, sys, runpy
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.figure
script = runpy.run_path(sys.argv[1])
work = Path(sys.argv[2])
real_replace = os.replace
calls = {"n": 0, "fail_at": 0}

def interrupting_replace(src, dst, *args, **kwargs):
    calls["n"] += 1
    if calls["n"] == calls["fail_at"]:
        raise KeyboardInterrupt  # Ctrl-C between writing a temporary file and renaming it
    return real_replace(src, dst, *args, **kwargs)

os.replace = interrupting_replace
results = []
for fail_at in range(1, 6):
    for existing in (False, True):
        calls.update(n=0, fail_at=0)
        save = work / f"save-{fail_at}-{existing}"
        if existing:
            script["fixture"].write_fixture(save)
        calls.update(n=0, fail_at=fail_at)
        status = script["main"](["--jit", "--epochs", "1", "--save", str(save)])
        results.append({"fail_at": fail_at, "existing": existing, "status": status,
                        "replaces": calls["n"]})
calls.update(n=0, fail_at=0)

real_savefig = matplotlib.figure.Figure.savefig
def interrupted_savefig(self, handle, *args, **kwargs):
    handle.write(b"\x89PNG half")
    raise KeyboardInterrupt  # Ctrl-C in the middle of writing the plot
matplotlib.figure.Figure.savefig = interrupted_savefig
plot = work / "plots" / "loss.png"
status = script["main"](["--jit", "--epochs", "1", "--plot", str(plot)])
results.append({"plot": True, "status": status})
print(json.dumps(results))
"""


def test_ctrl_c_at_every_write_step_of_save_and_plot(tmp_path):
    """Ctrl-C injected at the k-th rename of `--save` (k = 1..5: checkpoint.npz, vocab.json,
    corpus.json, manifest.json, past the end) and in the middle of writing `--plot`."""
    work = tmp_path / "work"
    work.mkdir()
    result = _run([sys.executable, "-c", SAVE_INTERRUPTIONS, str(TRAIN), str(work)], tmp_path,
                  env={**ENV, "TMPDIR": str(tmp_path)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    patterned = fixture.load_checkpoint(COMMITTED).arrays()
    order = ["checkpoint.npz", "vocab.json", "corpus.json", "manifest.json"]
    for run in runs[:-1]:
        save = work / f"save-{run['fail_at']}-{run['existing']}"
        written = order[:run["fail_at"] - 1]  # renamed before the interrupted one
        if run["fail_at"] <= len(order):
            assert run["status"] == 130, run
        else:
            assert run["status"] in (0, 1), run  # completed (1 epoch fails check (b))
        assert _leftovers(save) == [], run
        if not run["existing"]:
            assert sorted(p.name for p in save.iterdir()) == sorted(written), run
            if len(written) == len(order):
                fixture.load_checkpoint(save)
            continue
        # Over an old checkpoint: every file is whole -- either the old or the new one.
        names = sorted(p.name for p in save.iterdir())
        assert names == sorted(order), run
        checkpoint = fixture.load_checkpoint(save)  # the manifest always names whole files
        updated = not np.array_equal(checkpoint.wq, patterned["wq"])
        assert updated == ("checkpoint.npz" in written), run
    plot_run = runs[-1]
    assert plot_run["status"] == 130
    assert list((work / "plots").iterdir()) == []  # neither loss.png nor its temporary


def _library_is_whole(path: Path) -> bool:
    try:
        library = ctypes.CDLL(str(path))
    except OSError:
        return False
    return bool(library.kina_storylm0_nll_step)


def _link_phase(temp: Path, out: Path, phase: str) -> bool:
    """Has `python -m tilegen.compile -o` reached `phase` of writing the library?"""
    work = [p for p in temp.iterdir() if p.name.startswith("tilegen-")]
    if phase == "object code":  # the build folder exists; LLVM emits the object into it
        return bool(work)
    if phase == "system linker":  # the object file is written; cc runs
        return any((w / "module.so").exists() or (w / "module.o").exists() and
                   (w / "module.o").stat().st_size > 0 for w in work)
    return any(p.name.startswith(".tilegen-") for p in out.iterdir())  # the staging copy


@POSIX
@pytest.mark.parametrize(("phase", "delay"), [("object code", 0.0), ("system linker", 0.0),
                                              ("system linker", 0.02), ("staging", 0.0)])
def test_sigint_during_the_link_of_dash_o(tmp_path, phase, delay):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) at each phase of
    writing -o: out.so is either absent or whole, and no staging file or build folder stays."""
    temp, out = tmp_path / "tmp", tmp_path / "out"
    temp.mkdir()
    out.mkdir()
    target = out / "step.so"
    process = subprocess.Popen(
        [sys.executable, "-m", "tilegen.compile", "storylm0_nll_step.kina", "-o", str(target)],
        cwd=tmp_path, env={**ENV, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait_for(lambda: _link_phase(temp, out, phase) or process.poll() is not None,
                         120, interval=0.0005)
        time.sleep(delay)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    if process.returncode == 0:  # finished before the signal landed
        assert _library_is_whole(target), stdout + stderr
    else:
        assert not target.exists() or _library_is_whole(target), stderr
    assert [p.name for p in out.iterdir()] in ([], ["step.so"])
    # The build folder in TMPDIR goes too, unless Ctrl-C lands inside its own removal
    # (tempfile's cleanup), which Python cannot finish once interrupted.
    if "tempfile.py" not in stderr:
        assert list(temp.iterdir()) == [], stderr


def _interrupted_after_creating(prefix: str):
    """An `os.open` that raises KeyboardInterrupt just after it creates a file named
    `prefix...`: Ctrl-C landing between a staging file's creation and its name's return."""
    real_open = os.open

    def created_then_interrupted(file, flags, *args, **kwargs):
        descriptor = real_open(file, flags, *args, **kwargs)
        if os.path.basename(file).startswith(prefix):
            os.close(descriptor)
            raise KeyboardInterrupt
        return descriptor

    return created_then_interrupted


def test_interrupted_link_keeps_the_old_library(tmp_path, monkeypatch):
    """Ctrl-C while the staging copy is created, while the finished library is copied into
    it next to its destination, or while it is renamed onto it: the library already there
    is untouched and the staging copy is removed."""
    from kina_frontend import load_program, specialize
    from tilegen import library
    from tilegen.pipeline import plan_program

    plans = plan_program(specialize(load_program("storylm0_forward.kina")))
    target = tmp_path / "forward.so"
    target.write_bytes(b"old library")

    def half_copy(source, destination, *args, **kwargs):
        Path(destination).write_bytes(Path(source).read_bytes()[:100])
        raise KeyboardInterrupt

    def no_rename(*args, **kwargs):
        raise KeyboardInterrupt

    created_then_interrupted = _interrupted_after_creating(".tilegen-")
    for name, replacement in (("copyfile", half_copy), ("replace", no_rename),
                              ("open", created_then_interrupted)):
        with monkeypatch.context() as patch:
            patch.setattr(library.shutil if name == "copyfile" else library.os, name,
                          replacement)
            with pytest.raises(KeyboardInterrupt):
                library.write_library(plans, str(target))
        assert target.read_bytes() == b"old library"
        assert [p.name for p in tmp_path.iterdir()] == ["forward.so"]


def test_interrupted_cache_write_leaves_no_partial_entry(tmp_path, monkeypatch):
    """TILEGEN_CACHE_DIR: Ctrl-C while an entry is written leaves no temporary and no entry;
    the next compile rebuilds it and computes the right numbers."""
    import tilegen
    from tilegen import cache

    source = ("fn f(x: Tensor[F32, [4, 8], @host]) -> Tensor[F32, [4, 8], @host] {\n"
              f"  return softmax(x * {time.time_ns() % 1000 + 2}.0, axis=1);\n}}\n")
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path / "cache"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    created_then_interrupted = _interrupted_after_creating(".tmp-")
    for name, replacement in (("replace", interrupted), ("open", created_then_interrupted)):
        with monkeypatch.context() as patch:
            patch.setattr(cache.os, name, replacement)
            with pytest.raises(KeyboardInterrupt):
                tilegen.compile_source(source, "cached.kina").f  # noqa: B018 -- compiles
        assert _leftovers(tmp_path / "cache") == []
        assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got = tilegen.compile_source(source, "cached.kina").f(x)
    np.testing.assert_allclose(got.sum(axis=1), np.ones(4), rtol=1e-5)


# ---- unwritable destinations (once backend bugs: OSErrors escaped as tracebacks) -----------

def test_dash_o_to_an_unwritable_place_is_a_clear_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    for target in ("missing/x.so", "afile/x.so", "."):
        result = _run([sys.executable, "-m", "tilegen.compile", "storylm0_forward.kina", "-o",
                       str(tmp_path / target)], tmp_path)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr, target
        assert result.stderr.startswith(f"error[K600]: cannot write '{tmp_path / target}'")
        assert _leftovers(tmp_path) == []


def test_unusable_cache_dir_does_not_break_compiling(tmp_path, monkeypatch):
    """The disk cache only saves time: an unusable TILEGEN_CACHE_DIR is a warning."""
    import tilegen

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path / "afile"))
    factor = time.time_ns() % 1000 + 2  # a new program: the in-memory cache cannot answer
    source = ("fn f(x: Tensor[F32, [2], @host]) -> Tensor[F32, [2], @host] { return x * "
              f"{factor}.0; }}\n")
    with pytest.warns(RuntimeWarning, match="TILEGEN_CACHE_DIR"):
        module = tilegen.compile_source(source, "nocache.kina")
    np.testing.assert_array_equal(module.f(np.ones(2, np.float32)), [factor, factor])
    assert (tmp_path / "afile").read_text() == "x"
