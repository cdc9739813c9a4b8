"""The PASS/FAIL table the validation scripts print."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    label: str
    status: str  # PASS | FAIL | SKIP
    detail: str


class Report:
    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, label: str, passed: bool, detail: str) -> None:
        self.checks.append(Check(label, "PASS" if passed else "FAIL", detail))

    def skip(self, label: str, detail: str) -> None:
        self.checks.append(Check(label, "SKIP", detail))

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)

    def table(self, name: str) -> str:
        """`result  check  detail` rows, then `name: PASS|FAIL (counts)`."""
        width = max(len(c.label) for c in self.checks)
        lines = [f"{'result':<6}  {'check':<{width}}  detail",
                 f"{'-' * 6}  {'-' * width}  {'-' * 40}"]
        lines += [f"{c.status:<6}  {c.label:<{width}}  {c.detail}" for c in self.checks]
        counts = {status: sum(c.status == status for c in self.checks)
                  for status in ("PASS", "FAIL", "SKIP")}
        lines.append("")
        lines.append(f"{name}: {'FAIL' if self.failed else 'PASS'} ({counts['PASS']} passed, "
                     f"{counts['FAIL']} failed, {counts['SKIP']} skipped)")
        return "\n".join(lines)
