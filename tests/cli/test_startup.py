"""Start-up stays cheap: the CLI's entry point and the quick commands import no numerical or parsing library
(the CPU time itself is measured by benchmarks/cli_startup.py, not here)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
HEAVY = ("numpy", "networkx", "lark", "ml_dtypes", "torch", "pypto", "pydot", "scipy", "tqdm", "dask")


def loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return [m for m in json.loads(done.stdout.splitlines()[-1]) if m in HEAVY]


def test_importing_the_entry_point_imports_no_heavy_library():
    assert loaded_after("import dspark_cli.main; dspark_cli.main.build_parser('')") == []


@pytest.mark.parametrize("argv", [["--help"], ["list"]])
def test_help_and_list_import_no_heavy_library(argv):
    code = f"import contextlib, io, dspark_cli.main as m\nwith contextlib.redirect_stdout(io.StringIO()):\n" \
           f"    try: m.main({argv!r})\n    except SystemExit: pass"
    assert loaded_after(code) == []


def test_verify_needs_only_the_parser():
    example = ROOT / "examples" / "rmsnorm_matmul_rope.dsir"
    code = f"import contextlib, io, dspark_cli.main as m\nwith contextlib.redirect_stdout(io.StringIO()):\n" \
           f"    assert m.main(['verify', {str(example)!r}]) == 0"
    assert loaded_after(code) == ["lark"]


def test_pass_summaries_read_without_import_match_the_classes():
    from passes.infra import registry

    for name in registry.registered_names():
        read = registry.summary(name)
        assert read == registry.get_pass(name).summary(), name
