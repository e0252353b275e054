"""A checklist: measured differences against tolerances, recorded in order, shown as a table.

Each check is {"name", "kind", "passed", "max_abs_diff", "tolerance", "seconds"}: kind "twin"
(scratch against torch.nn.Transformer on shared weights) or "property" (what the model must do
whatever it is compared with). A measure returns the difference; a NaN difference never
passes, and a measure that raises fails its check with "error" saying why (a broken model may
break the measurement; verify still reports every check).
"""

import math
import time
from dataclasses import dataclass, field


def timed(fn, *args):
    """(fn(*args), the seconds it took)."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@dataclass
class Checklist:
    """The checks taken so far, of one kind; `prefix` goes before every name ("scratch: ")."""

    kind: str  # "twin" | "property"
    prefix: str = ""
    checks: list[dict] = field(default_factory=list)

    def record(self, name: str, diff: float, tolerance: float, seconds: float,
               error: str | None = None) -> None:
        """One measured difference against its tolerance."""
        check = {"name": self.prefix + name, "kind": self.kind, "passed": diff <= tolerance,
                 "max_abs_diff": float(diff), "tolerance": tolerance,
                 "seconds": round(seconds, 3)}
        self.checks.append(check | ({"error": error} if error else {}))

    def check(self, name: str, tolerance: float, measure, *args) -> None:
        """Time measure(*args), a difference, and record it; if it raises, record a failure."""
        start = time.perf_counter()
        try:
            diff, error = measure(*args), None
        except Exception as e:  # whatever breaks in the model fails the check
            diff, error = math.inf, f"{type(e).__name__}: {e}"
        self.record(name, diff, tolerance, time.perf_counter() - start, error)

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)


def format_table(result: dict) -> str:
    """The checks of {"checks", "passed"} (and "twin", "twin_reason" when run_checks made it
    for a model with twin checks) as an aligned text table, saying which kind of check ran."""
    rows = [("check", "kind", "passed", "max_abs_diff", "tolerance", "seconds")]
    rows += [(c["name"], c.get("kind", ""), "yes" if c["passed"] else "NO",
              f"{c['max_abs_diff']:.3g}", f"{c['tolerance']:.0e}", f"{c['seconds']:.2f}")
             for c in result["checks"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in
                       enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines += [f"{c['name']}: {c['error']}" for c in result["checks"] if c.get("error")]
    if result.get("twin") is not None:  # run_checks made it, for a model with twin checks
        lines.append(f"twin checks: {'ran' if result['twin'] else 'none'} "
                     f"({result['twin_reason']})")
    lines += [f"{name} not checked: {why}" for name, why in result.get("skipped", {}).items()]
    lines.append(f"all passed: {'yes' if result['passed'] else 'NO'}")
    return "\n".join(lines)


def print_checklist(result: dict) -> None:
    """Print the checks (check, kind, passed, max_abs_diff, tolerance, seconds) and which kinds
    ran."""
    print(format_table(result))
