"""Reading the fenced code blocks of the docs (their samples are tested)."""

from __future__ import annotations

from pathlib import Path


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The bodies of the fenced blocks opened with ```language (plain ``` for "")."""
    blocks, current, opened = [], [], None
    for line in path.read_text().split("\n"):
        if line.startswith("```") and opened is None:
            opened, current = line[3:], []
        elif line == "```" and opened is not None:
            if opened == language:
                blocks.append("\n".join(current) + "\n")
            opened = None
        elif opened is not None:
            current.append(line)
    return blocks
