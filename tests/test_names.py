"""Kina names never collide with the host: generated symbols, the Python wrapper, the
module's own attributes (issue 17, item 3)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError
from tests.hostile_names import hostile_programs
from tilegen.api import compile_source
from tilegen.runtime import CompiledModule

PROGRAMS = hostile_programs()


@pytest.fixture(scope="module", params=[True, False], ids=["jit", "so"])
def modules(request):
    return [(names, compile_source(text, f"hostile{i}.kina", jit=request.param))
            for i, (names, text) in enumerate(PROGRAMS)]


def test_every_hostile_name_is_its_own_function(modules):
    x = np.arange(5, dtype=np.float32)
    y = np.full(5, 0.5, np.float32)
    strided = np.arange(10, dtype=np.float32)[::2]  # declined by the native entry
    for names, module in modules:
        assert sorted(dir(module)) == sorted(names)
        for k, name in enumerate(names):
            function = getattr(module, name)
            want = x * (k + 1) + y
            np.testing.assert_array_equal(function(x, y), want, err_msg=name)
            np.testing.assert_array_equal(function(strided, y), strided * (k + 1) + y,
                                          err_msg=name)
            out = np.empty(5, np.float32)
            assert function(x, y, out=out) is out
            np.testing.assert_array_equal(out, want, err_msg=name)
            assert getattr(module, name) is function, name  # a real attribute now


def test_module_attributes_are_the_functions(modules):
    (names, module), _ = modules
    x = np.ones(5, np.float32)
    for name in ("kind", "plans", "functions", "function", "__init__", "__class__",
                 "__dict__", "__repr__", "__getattr__"):
        assert name in names
        assert callable(getattr(module, name)), name
        np.testing.assert_array_equal(getattr(module, name)(x, x), x * (names.index(name) + 2))
    # The module still behaves as an object, and its own data lives apart.
    assert isinstance(module, CompiledModule)
    assert repr(module).startswith("<tilegen module (")
    program = tilegen.program_of(module)
    assert program.kind in ("jit", "so") and set(program.signatures) == set(names)
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        module.nope  # noqa: B018


def test_python_errors_name_the_kina_function(modules):
    _, (names, module) = modules
    assert "_p0" in names and "lambda" in names
    with pytest.raises(TypeError, match=r"^_p0\(\) missing 1 required positional"):
        module._p0(np.ones(5, np.float32))
    with pytest.raises(tilegen.ArgumentError, match=r"lambda\(\): argument 'a' must have"):
        getattr(module, "lambda")(np.ones(5), np.ones(5, np.float32))


def test_emit_llvm_and_library_with_hostile_names(tmp_path):
    names, text = PROGRAMS[0]
    path = tmp_path / "hostile.kina"
    path.write_text(text)
    llvm = subprocess.run([sys.executable, "-m", "tilegen.compile", str(path), "--emit", "llvm"],
                          capture_output=True, text=True, timeout=600)
    assert llvm.returncode == 0, llvm.stderr
    for name in ("entry_f", "runtime_table", "__init__"):
        assert re.search(rf'define .*@"?kina\.{name}"?\(', llvm.stdout), name
    library = subprocess.run([sys.executable, "-m", "tilegen.compile", str(path), "-o",
                              str(tmp_path / "hostile.so")], capture_output=True, text=True,
                             timeout=600)
    assert library.returncode == 0, library.stderr
    module = tilegen.load_library(tmp_path / "hostile.so")
    x = np.ones(5, np.float32)
    np.testing.assert_array_equal(module.entry_f(x, x), x * (names.index("entry_f") + 2))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "so"])
def test_more_parameters_than_ctypes_takes(jit):
    count = 1030  # ctypes calls take at most 1024 arguments
    params = ", ".join(f"a{i}: Tensor[F32, [3], @host]" for i in range(count))
    module = compile_source(f"fn wide({params}) -> Tensor[F32, [3], @host] "
                            f"{{ return add(a7, a{count - 1}); }}", "wide.kina", jit=jit)
    args = [np.full(3, i, np.float32) for i in range(count)]
    np.testing.assert_array_equal(module.wide(*args), np.full(3, 7 + count - 1, np.float32))
    args[7] = np.full(6, 7, np.float32)[::2]  # the checked (ctypes) path
    np.testing.assert_array_equal(module.wide(*args), np.full(3, 7 + count - 1, np.float32))


def test_last_error_is_the_one_name_the_c_abi_refuses():
    text = "fn last_error(x: Tensor[F32, [2], @host]) -> Tensor[F32, [2], @host] {\n" \
           "  return neg(x);\n}\n"
    np.testing.assert_array_equal(compile_source(text, "le.kina").last_error(np.ones(2)
                                                                              .astype("f4")),
                                  -np.ones(2, np.float32))
    with pytest.raises(KinaError, match=r"le.kina:1:1: .*'last_error' cannot be exported: "
                                        r"its C name would be the library's own "
                                        r"kina_last_error"):
        compile_source(text, "le.kina", jit=False)
