"""House rules checked over the source tree: no private name crosses a module boundary."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aotc", "aotc_runtime")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, filename: str = "<source>") -> list[str]:
    """`module.name` for every private name an import takes from one of our packages."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            ours = node.level > 0 or module.split(".")[0] in PACKAGES
            if not ours:
                continue
            if any(_is_private(part) for part in module.split(".")):
                found.append(f"{'.' * node.level}{module}")
            found.extend(f"{'.' * node.level}{module}.{a.name}" for a in node.names if _is_private(a.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in PACKAGES and any(_is_private(p) for p in parts):
                    found.append(alias.name)
    return found


def source_files() -> list[Path]:
    return sorted([*(ROOT / "aotc").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")])


def test_the_checker_sees_private_imports():
    src = "from aotc.topi.nn import as_pair, _pads\nfrom .x import _y\nimport aotc._z\nfrom os import _exit\n"
    assert private_imports(src) == ["aotc.topi.nn._pads", ".x._y", "aotc._z"]


def test_no_module_imports_a_private_name_from_another():
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in source_files()
        for name in private_imports(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)
