"""No module imports a private name of another module (DEVELOPERS.md), checked on the source with `ast`.

A private name is one with a leading underscore that is not a dunder. Flagged, for every import that resolves to
one of our packages:
* `from m import _name` (a private function, class, constant or submodule of another module);
* a private module (`kernels._pypto`) imported from outside the package that holds it. Inside that package it is
  the package's own building block (`from ._pypto import tile` in kernels/qkv.py is fine).
Third-party privates are out of scope (kernels/pypto_rt patches pypto's on purpose). ruff's PLC2701 is the same
rule but, in preview only, and it ignores imports within one top-level package, which is where most would be.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dspark_cli", "perf", "lowering", "passes", "kernels", "runner", "dspark_ir", "goldens", "benchmarks",
            "tests")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(path: Path, root: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = list(path.relative_to(root).parts[:-1])  # the package a level-1 relative import starts from
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_module_outside(importer: str, target: str) -> str | None:
    """The first private module on `target`'s path whose package does not contain `importer`, if any."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if is_private(part):
            package = ".".join(parts[:i])
            if not (importer == package or importer.startswith(package + ".")):
                return ".".join(parts[:i + 1])
    return None


def violations_in(path: Path, root: Path = ROOT) -> list[str]:
    importer = module_of(path, root)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(root)}:{node.lineno}" if hasattr(node, "lineno") else ""
        if isinstance(node, ast.ImportFrom):
            module = resolve(path, root, node)
            if module.split(".")[0] not in PACKAGES:
                continue
            hidden = private_module_outside(importer, module)
            if hidden:
                out.append(f"{where}: imports from private module {hidden}")
                continue
            for alias in node.names:
                if not is_private(alias.name):
                    continue
                target = f"{module}.{alias.name}"
                file = root.joinpath(*target.split("."))
                if file.with_suffix(".py").exists() or (file / "__init__.py").exists():
                    if private_module_outside(importer, target) is None:
                        continue  # the package's own private module, imported inside the package
                out.append(f"{where}: imports private name {alias.name} from {module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    hidden = private_module_outside(importer, alias.name)
                    if hidden:
                        out.append(f"{where}: imports private module {hidden}")
    return out


def all_violations() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += violations_in(path)
    return found


def test_no_module_imports_a_private_name_of_another_module():
    found = all_violations()
    assert not found, f"{len(found)} private import(s):\n" + "\n".join(found)


def test_the_check_finds_each_form(tmp_path):
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_helpers.py").write_text("def tile(): pass\n")
    (pkg / "qkv.py").write_text("def _rows(): pass\n")
    (pkg / "attn.py").write_text("from ._helpers import tile\nfrom . import _helpers\nfrom .qkv import _rows\n"
                                 "from kernels.qkv import __doc__\n")
    (tmp_path / "lowering").mkdir()
    (tmp_path / "lowering" / "codegen.py").write_text("from kernels import _helpers\nimport kernels._helpers\n"
                                                      "from kernels._helpers import tile\nfrom pypto import _x\n")
    found = violations_in(pkg / "attn.py", tmp_path)
    assert found == ["kernels/attn.py:3: imports private name _rows from kernels.qkv"]
    assert violations_in(tmp_path / "lowering" / "codegen.py", tmp_path) == [
        "lowering/codegen.py:1: imports private name _helpers from kernels",
        "lowering/codegen.py:2: imports private module kernels._helpers",
        "lowering/codegen.py:3: imports from private module kernels._helpers",
    ]
