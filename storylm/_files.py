"""Byte-level file helpers for the fixture: atomic writes, stable JSON, deterministic .npz."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

# np.savez stamps each member with the current time; a fixed stamp keeps the archive
# reproducible bit for bit. 1980-01-01 is the earliest date a zip header can hold.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_UNIX_SYSTEM = 3
_FILE_MODE = 0o644


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one.

    The bytes go to a temporary file in the same folder (same file system, so the rename is
    atomic), are flushed to disk, and only then replace `path`.
    """
    descriptor, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                             suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as temp_file:
            temp_file.write(data)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.chmod(temp_name, _FILE_MODE)  # mkstemp creates 0600; fixtures are ordinary files
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise


def json_bytes(value: object) -> bytes:
    """Stable, readable JSON: objects one key per line, lists of scalars on one line."""
    return (_format_json(value, indent="") + "\n").encode("utf-8")


def _format_json(value: object, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, Mapping) and value:
        items = [f"{inner}{json.dumps(key)}: {_format_json(item, inner)}"
                 for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple))
                                                for v in value):
        items = [inner + _format_json(item, inner) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(value, allow_nan=False)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An uncompressed .npz archive (what np.savez writes) with fixed member metadata."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE_TIME)
            info.create_system = _ZIP_UNIX_SYSTEM  # the default depends on the host OS
            info.external_attr = _FILE_MODE << 16
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()
