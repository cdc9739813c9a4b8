"""The C ABI: a header that compiles as C99 and C++, a C (and C++) program linked against
the .so, .a and .o forms and run with no Python in the process, several threads calling
at once, errors as codes and thread-local messages (issue 18)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hostile_names import hostile_programs
from tilegen.api import compile_source
from tilegen.cabi import header
from tilegen.runtime import program_of

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="needs gcc and g++")

REPO = Path(__file__).resolve().parent.parent
PROGRAM = """
const V = 11;
const D = 7;
const T = 5;

fn embed_rows(table: Tensor[F32, [V, D], @host], ids: Tensor[I64, [1, T], @host])
    -> Tensor[F32, [1, T, D], @host] {
  return gather(table, ids);
}

fn softmax_rows(x: Tensor[F64, [300, 130], @host]) -> Tensor[F64, [300, 130], @host] {
  return softmax(x, axis=1);
}

fn mm(a: Tensor[F32, [200, 300], @host], b: Tensor[F32, [300, 170], @host])
    -> (Tensor[F32, [200, 170], @host], Tensor[F32, [200], @host]) {
  return (matmul(a, b), sum(a, axis=1));
}
"""

# Valid C99 and C++11: reads the inputs the test wrote, calls every function, runs `mm`
# from four threads at once, provokes each error, writes what it computed.
MAIN = r"""
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "k.h"

static void *load(const char *path, size_t bytes) {
  FILE *file = fopen(path, "rb");
  void *data = malloc(bytes);
  if (!file || fread(data, 1, bytes, file) != bytes) { printf("cannot read %s\n", path); exit(3); }
  fclose(file);
  return data;
}

static void save(const char *path, const void *data, size_t bytes) {
  FILE *file = fopen(path, "wb");
  fwrite(data, 1, bytes, file);
  fclose(file);
}

struct job { const float *a, *b; float *c, *s; int status; };

static void *work(void *arg) {
  struct job *job = (struct job *)arg;
  for (int i = 0; i < 10; i++) job->status |= kina_mm(job->a, job->b, job->c, job->s);
  return NULL;
}

static void *fail_once(void *arg) {
  int64_t bad[5] = {0, 0, 0, 0, -4};
  *(int *)arg = kina_embed_rows((const float *)load("table.bin", 11 * 7 * 4), bad,
                                (float *)malloc(5 * 7 * 4));
  return NULL;
}

int main(void) {
  printf("python %s\n", dlsym(RTLD_DEFAULT, "Py_IsInitialized") ? "loaded" : "absent");
  printf("before \"%s\"\n", kina_last_error());
  const float *table = (const float *)load("table.bin", 11 * 7 * 4);
  const int64_t *ids = (const int64_t *)load("ids.bin", 5 * 8);
  float rows[5 * 7];
  printf("embed %d\n", kina_embed_rows(table, ids, rows));
  save("rows.bin", rows, sizeof rows);
  const double *x = (const double *)load("x.bin", 300 * 130 * 8);
  double *soft = (double *)malloc(300 * 130 * 8);
  printf("softmax %d\n", kina_softmax_rows(x, soft));
  save("soft.bin", soft, 300 * 130 * 8);
  const float *a = (const float *)load("a.bin", 200 * 300 * 4);
  const float *b = (const float *)load("b.bin", 300 * 170 * 4);
  struct job jobs[4];
  pthread_t threads[4];
  for (int t = 0; t < 4; t++) {
    jobs[t].a = a; jobs[t].b = b; jobs[t].status = 0;
    jobs[t].c = (float *)malloc(200 * 170 * 4);
    jobs[t].s = (float *)malloc(200 * 4);
    pthread_create(&threads[t], NULL, work, &jobs[t]);
  }
  for (int t = 0; t < 4; t++) {
    char name[16];
    pthread_join(threads[t], NULL);
    printf("thread %d %d\n", t, jobs[t].status);
    snprintf(name, sizeof name, "c%d.bin", t);
    save(name, jobs[t].c, 200 * 170 * 4);
    snprintf(name, sizeof name, "s%d.bin", t);
    save(name, jobs[t].s, 200 * 4);
  }
  int64_t bad[5] = {0, 1, 11, 2, 3};
  printf("id %d %s\n", kina_embed_rows(table, bad, rows), kina_last_error());
  printf("null %d %s\n", kina_embed_rows(table, NULL, rows), kina_last_error());
  printf("overlap %d %s\n", kina_softmax_rows(x, (double *)x), kina_last_error());
  int other = -1;
  pthread_t failing;
  pthread_create(&failing, NULL, fail_once, &other);
  pthread_join(failing, NULL);
  printf("other thread %d, this thread still \"%s\"\n", other, kina_last_error());
  return 0;
}
"""


def _run(command, cwd, env=None):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The program as libk.so, libk.a and k.o (each with k.h), and the inputs."""
    work = tmp_path_factory.mktemp("cabi")
    (work / "k.kina").write_text(PROGRAM)
    for output in ("libk.so", "libk.a", "k.o"):
        _run([sys.executable, "-m", "tilegen.compile", "k.kina", "-o", output, "--header",
              "k.h"], work, env={**os.environ, "PYTHONPATH": str(REPO)})
    rng = np.random.default_rng(18)
    inputs = {"table": rng.standard_normal((11, 7)).astype(np.float32),
              "ids": rng.integers(0, 11, (1, 5)),
              "x": rng.standard_normal((300, 130)) * 4,
              "a": rng.standard_normal((200, 300)).astype(np.float32),
              "b": rng.standard_normal((300, 170)).astype(np.float32)}
    for name, array in inputs.items():
        array.tofile(work / f"{name}.bin")
    (work / "main.c").write_text(MAIN)
    return work, inputs


def _check_outputs(work: Path, inputs: dict, stdout: str) -> None:
    lines = stdout.splitlines()
    assert lines[:2] == ["python absent", 'before ""']
    assert "embed 0" in lines and "softmax 0" in lines
    rows = np.fromfile(work / "rows.bin", np.float32).reshape(1, 5, 7)
    np.testing.assert_array_equal(rows, inputs["table"][inputs["ids"]])
    x = inputs["x"]
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(np.fromfile(work / "soft.bin").reshape(300, 130),
                               shifted / shifted.sum(axis=1, keepdims=True), rtol=1e-12,
                               atol=1e-15)
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    for t in range(4):
        assert f"thread {t} 0" in lines
        c = np.fromfile(work / f"c{t}.bin", np.float32).reshape(200, 170)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(np.fromfile(work / f"s{t}.bin", np.float32), a.sum(axis=1),
                                   rtol=1e-4, atol=1e-4)
    errors = "\n".join(lines)
    assert ("id 1 embed_rows(): gather at k.kina:8:10: id 11 at position [0, 2] of argument "
            "'ids' is out of range [0, 11)") in errors
    assert "null 3 embed_rows(): argument 'ids' is NULL" in errors
    assert ("overlap 4 softmax_rows(): output 0 overlaps another argument; outputs must not "
            "alias inputs or each other") in errors
    assert ('other thread 1, this thread still "softmax_rows(): output 0 overlaps another '
            'argument') in errors


def _clean_environment() -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.mark.parametrize("compiler, standard", [("gcc", "-std=c99"), ("g++", "-std=c++11")])
def test_c_program_on_the_shared_library(built, compiler, standard):
    work, inputs = built
    _run([compiler, standard, "-Wall", "-Wextra", "-Werror", "-x",
          "c" if compiler == "gcc" else "c++", "main.c", "-x", "none", "-o", "main_so", "-L.",
          "-lk", f"-Wl,-rpath,{work}", "-lpthread", "-ldl"], work)
    _check_outputs(work, inputs, _run(["./main_so"], work, env=_clean_environment()))


@pytest.mark.parametrize("library", ["libk.a", "k.o"])
def test_c_program_on_the_static_forms(built, library):
    work, inputs = built
    _run(["gcc", "-std=c99", "-Wall", "-Werror", "main.c", library, "-o", "main_static",
          "-lgomp", "-lm", "-lpthread", "-ldl"], work)
    _check_outputs(work, inputs, _run(["./main_static"], work, env=_clean_environment()))


def test_the_library_needs_no_python(built):
    work, _ = built
    undefined = _run(["nm", "-D", "--undefined-only", "libk.so"], work)
    assert "Py" not in undefined, undefined
    assert "python" not in _run(["ldd", "libk.so"], work).lower()


def test_header_with_hostile_names_compiles_as_c99_and_cxx(tmp_path):
    for index, (_, text) in enumerate(hostile_programs()):
        signatures = list(program_of(compile_source(text, f"h{index}.kina")).signatures
                          .values())
        (tmp_path / f"h{index}.h").write_text(header(signatures, f"h{index}.h", "libh.so",
                                                     "h.kina"))
    includes = "#include <errno.h>\n#include <stdio.h>\n" + "".join(
        f'#include "h{i}.h"\n#include "h{i}.h"\n' for i in range(2))
    (tmp_path / "use.c").write_text(includes + "int main(void) { return KINA_OK; }\n")
    _run(["gcc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
          "use.c"], tmp_path)
    _run(["g++", "-std=c++11", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
          "-x", "c++", "use.c"], tmp_path)
