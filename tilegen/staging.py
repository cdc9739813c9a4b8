"""Staging files and build folders that a Ctrl-C at any moment cannot leave behind.

Writes go through a staging file before `os.replace` publishes them.

`tempfile.mkstemp` creates its file before it returns the name, so a Ctrl-C landing between
the two leaves a file its caller cannot know to remove. Callers bind the name from
`staging_name` first and only then create the file with `create_staging_file`, so their
cleanup always knows what to remove.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator


def staging_name(directory: str | os.PathLike[str], prefix: str) -> str:
    """A fresh name in `directory` for a staging file; nothing is created."""
    return os.path.join(directory, f"{prefix}{os.getpid()}-{secrets.token_hex(8)}")


def create_staging_file(name: str) -> int:
    """Create `name` (owner read/write, failing if it exists) and return its descriptor."""
    return os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[str]:
    """A fresh folder in the temporary directory, removed on the way out, also when a
    Ctrl-C lands inside its creation or inside its own removal (`tempfile`'s
    TemporaryDirectory leaves it behind in both cases: it binds the name only after
    `mkdtemp` returns, and an interrupted cleanup is not resumed)."""
    folder = staging_name(tempfile.gettempdir(), prefix)
    try:
        os.mkdir(folder, 0o700)
        yield folder
    finally:
        try:
            shutil.rmtree(folder, ignore_errors=True)
        except KeyboardInterrupt:  # the one Ctrl-C landed in the removal: finish it first
            shutil.rmtree(folder, ignore_errors=True)
            raise
