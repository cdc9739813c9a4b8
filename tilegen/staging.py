"""Names for the staging files that writes go through before `os.replace` publishes them.

`tempfile.mkstemp` creates its file before it returns the name, so a Ctrl-C landing between
the two leaves a file its caller cannot know to remove. Callers bind the name from
`staging_name` first and only then create the file with `create_staging_file`, so their
cleanup always knows what to remove.
"""

from __future__ import annotations

import os
import secrets


def staging_name(directory: str | os.PathLike[str], prefix: str) -> str:
    """A fresh name in `directory` for a staging file; nothing is created."""
    return os.path.join(directory, f"{prefix}{os.getpid()}-{secrets.token_hex(8)}")


def create_staging_file(name: str) -> int:
    """Create `name` (owner read/write, failing if it exists) and return its descriptor."""
    return os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
