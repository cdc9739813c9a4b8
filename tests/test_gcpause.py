"""The cyclic garbage collector is paused while tilegen compiles (tilegen/gcpause.py): a
compile starts no collection of the older generations, however low the thresholds, the
collector's state is restored afterwards (also when the compile fails, and when the program
had disabled it), and the IR the compile built is garbage that is freed."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

import tilegen
from kina_frontend import KinaError
from tilegen.cache import MEMORY
from tilegen.gcpause import collector_paused

SOURCE = """
fn f(x: Tensor[F32, [3, 40], @host], w: Tensor[F32, [40, 24], @host])
    -> Tensor[F32, [3, 24], @host] {
  return relu(x @ w);
}
"""


@pytest.fixture
def low_thresholds():
    """Thresholds at which an unpaused compile collects the old generations many times
    (after one compile that imports what compiling needs: imports are not paused)."""
    _compile()
    saved = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _collections_during(action) -> list[int]:
    generations: list[int] = []

    def note(phase, info):
        if phase == "start":
            generations.append(info["generation"])
    gc.callbacks.append(note)
    try:
        action()
    finally:
        gc.callbacks.remove(note)
    return generations


def _compile() -> None:
    MEMORY.clear()
    module = tilegen.compile_source(SOURCE, "paused.kina")
    assert list(tilegen.program_of(module).functions) == ["f"]  # machine code too


def test_a_compile_collects_no_old_generation(low_thresholds) -> None:
    assert gc.isenabled()
    generations = _collections_during(_compile)
    # One collection of the youngest generation as each paused step ends (compile_source,
    # then the machine code on first use), nothing older.
    assert generations == [0, 0], generations
    assert gc.isenabled()


def test_the_program_s_disabled_collector_stays_disabled(low_thresholds) -> None:
    gc.disable()
    try:
        assert _collections_during(_compile) == []
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_compile_restores_the_collector() -> None:
    with pytest.raises(KinaError):
        tilegen.compile_source("fn f( {", "broken.kina")
    assert gc.isenabled()


def test_nested_and_concurrent_pauses_resume_once_at_the_end() -> None:
    inside = threading.Event()
    release = threading.Event()

    def other():
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread still compiles
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_the_compile_s_ir_is_freed() -> None:
    """The llvmlite module codegen built (cyclic: functions and blocks point at their
    parents) does not outlive the compile."""
    from tilegen import pipeline

    built: list[weakref.ref] = []
    codegen = pipeline.codegen

    def recording(*args, **kwargs):
        module = codegen(*args, **kwargs)
        built.append(weakref.ref(module))
        return module

    MEMORY.clear()
    pipeline_codegen, pipeline.codegen = pipeline.codegen, recording
    import tilegen.runtime as runtime
    runtime_codegen, runtime.codegen = runtime.codegen, recording
    try:
        module = tilegen.compile_source(SOURCE, "freed.kina")
        tilegen.program_of(module).functions  # noqa: B018 (compiles)
    finally:
        pipeline.codegen, runtime.codegen = pipeline_codegen, runtime_codegen
    assert built and all(ref() is None for ref in built)
