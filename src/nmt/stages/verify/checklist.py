"""A checklist: measured differences against tolerances, recorded in order, shown as a table.

Each check is {"name", "passed", "max_abs_diff", "tolerance", "seconds"}; a measure returns
the difference, and a NaN difference never passes.
"""

import time
from dataclasses import dataclass, field


def timed(fn, *args):
    """(fn(*args), the seconds it took)."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@dataclass
class Checklist:
    """The checks taken so far; `prefix` goes before every name ("decoder_only: ")."""

    prefix: str = ""
    checks: list[dict] = field(default_factory=list)

    def record(self, name: str, diff: float, tolerance: float, seconds: float) -> None:
        """One measured difference against its tolerance."""
        self.checks.append({"name": self.prefix + name, "passed": diff <= tolerance,
                            "max_abs_diff": float(diff), "tolerance": tolerance,
                            "seconds": round(seconds, 3)})

    def check(self, name: str, tolerance: float, measure, *args) -> None:
        """Time measure(*args), a difference, and record it."""
        diff, seconds = timed(measure, *args)
        self.record(name, diff, tolerance, seconds)

    def extend(self, checks: list[dict]) -> None:
        """Append checks another checklist took."""
        self.checks.extend(checks)

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)


def format_table(result: dict) -> str:
    """The checks of {"checks", "passed"} as an aligned text table."""
    rows = [("check", "passed", "max_abs_diff", "tolerance", "seconds")]
    rows += [(c["name"], "yes" if c["passed"] else "NO", f"{c['max_abs_diff']:.3g}",
              f"{c['tolerance']:.0e}", f"{c['seconds']:.2f}") for c in result["checks"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in
                       enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"all passed: {'yes' if result['passed'] else 'NO'}")
    return "\n".join(lines)


def print_table(result: dict) -> None:
    """Print the checks: check, passed, max_abs_diff, tolerance, seconds."""
    print(format_table(result))
