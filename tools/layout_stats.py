"""Print the layout's shape: modules per folder of src/nmt and its longest functions (the
figures issue 32 compares before and after the folders became layers).

    python tools/layout_stats.py [--root src/nmt] [--top 5]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path


def functions(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("src/nmt"))
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    modules = sorted(args.root.rglob("*.py"))
    per_folder = Counter(str(m.parent.relative_to(args.root.parent)) for m in modules)
    print(f"{len(modules)} modules in {len(per_folder)} folders")
    for folder, count in sorted(per_folder.items()):
        print(f"  {count:3d}  {folder}/")
    longest = sorted(((n, f"{m}:{line}", name) for m in modules
                      for name, line, n in functions(m)), reverse=True)[:args.top]
    print("longest functions (lines):")
    for n, where, name in longest:
        print(f"  {n:4d}  {name}  {where}")


if __name__ == "__main__":
    main()
