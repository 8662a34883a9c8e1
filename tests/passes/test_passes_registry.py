"""The registry: lazy, one module per pass, declarations checked at registration."""
from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import passes
from dspark_cli.main import main
from passes import Pass, get_pass, register_pass, registered_names, summary
from passes.infra.checked import CheckedPass
from passes.infra.registry import pass_modules

ROOT = Path(__file__).parents[2]


def test_names_and_summaries(capsys):
    assert {"canonicalize", "cse", "dce"} <= set(registered_names())
    assert summary("cse") == "Common-subexpression elimination: a node equal to an earlier one is replaced by it."
    assert main(["list", "passes"]) == 0
    out = capsys.readouterr().out
    assert "  canonicalize " in out and "Fold reshape/slice/cast chains" in out


def test_every_pass_module_registers_its_kebab_name():
    """Every module of passes/ is a pass (the machinery is the passes/infra sub-package): no deny-list."""
    pass_modules.cache_clear()  # pass modules may have been added since the first listing
    package = Path(passes.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    assert {m.replace("_", "-") for m in modules} == set(pass_modules())
    for name in pass_modules():
        cls = get_pass(name)
        assert cls.name == name and cls.__module__ == pass_modules()[name]
        assert cls.__doc__.strip() and cls.contract is not None
    assert (package / "infra" / "registry.py").exists() and "infra" not in pass_modules()


def test_listing_does_not_import_pass_modules():
    code = ("import sys, passes; names = passes.registered_names(); "
            "print(any(m in sys.modules for m in ('passes.cse', 'passes.dce', 'passes.canonicalize')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("body, message", [
    ("name = 'Bad_Name'", "`name` must be a kebab-case string"),
    ("name = 'planted-x'\n    ways: list = None", "unsupported type"),
    ("name = 'planted-x'\n    ways: int", "needs a default"),
])
def test_bad_declarations_are_rejected(body, message):
    namespace: dict = {}
    source = f'''
from dataclasses import dataclass
from passes import Pass
@dataclass(frozen=True)
class P(Pass):
    """doc"""
    {body}
    def run(self, g):
        return []
'''
    exec(source, namespace)
    with pytest.raises(TypeError, match=message):
        register_pass(namespace["P"])


def test_missing_docstring_frozen_or_body():
    class NoDoc(Pass):
        name = "planted-nodoc"
    with pytest.raises(TypeError, match="frozen"):
        register_pass(NoDoc)
    with pytest.raises(TypeError, match="docstring"):
        register_pass(dataclass(frozen=True)(type("P", (Pass,), {"name": "planted-nodoc", "__doc__": None})))
    with pytest.raises(TypeError, match=r"implement match\(\) and rewrite\(\), or run\(\)"):
        register_pass(dataclass(frozen=True)(type("P", (Pass,), {"name": "planted-nobody", "__doc__": "d"})))
    with pytest.raises(TypeError, match="registered twice"):
        register_pass(dataclass(frozen=True)(type("P", (Pass,), {"name": "cse", "__doc__": "d",
                                                                   "run": lambda self, g: []})))


@pytest.mark.parametrize("given", ["check", "apply"])
def test_a_checked_pass_needs_check_and_apply(given):
    with pytest.raises(TypeError, match=r"a CheckedPass implements check\(\) and apply\(\)"):
        type("P", (CheckedPass,), {"name": "planted-half", "__doc__": "d", given: lambda self, g, x: None})


def test_plugin_flag(tmp_path, capsys):
    assert main(["opt", "--plugin", "no.such.module", "--print-pipeline"]) == 2
    assert capsys.readouterr().err.startswith("dspark: --plugin: cannot import pass plugin 'no.such.module'")
    assert importlib.import_module("tests.passes.planted")
    assert main(["opt", "--plugin", "tests.passes.planted", "-p", "planted-options", "--print-pipeline"]) == 0
