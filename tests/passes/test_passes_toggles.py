"""Toggles: one name space for CLI flags, DSPARK_DISABLE_PASSES and PassContext; each form changes the
effective pipeline as documented, and the effective pipeline feeds the cache key."""
from __future__ import annotations

import pytest

import passes.infra.defaults as defaults
from dspark_cli.main import main
from passes import PassContext, PipelineError, run_pipeline
from passes.infra.defaults import Entry

from .support import mini

pytestmark = pytest.mark.usefixtures("std_pipeline")


def effective(**kw) -> str:
    return str(PassContext(**kw).effective_pipeline())


def cli_effective(capsys, *flags: str) -> str:
    assert main(["opt", "--print-pipeline", *flags]) == 0
    return capsys.readouterr().out.splitlines()[1].removeprefix("#").strip()


def test_default_pipeline():
    assert effective() == "canonicalize,cse,dce"


def test_disable_forms_agree(monkeypatch, capsys):
    assert effective(disabled=["cse"]) == "canonicalize,dce"
    assert effective(disabled="cse,dce") == "canonicalize"
    assert cli_effective(capsys, "--disable", "cse") == "canonicalize,dce"
    assert cli_effective(capsys, "--disable", "cse,dce") == "canonicalize"
    assert cli_effective(capsys, "--disable", "cse", "--disable", "dce") == "canonicalize"
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "cse")
    assert effective() == "canonicalize,dce"
    assert cli_effective(capsys) == "canonicalize,dce"
    assert effective(use_env=False) == "canonicalize,cse,dce"
    assert cli_effective(capsys, "--no-env") == "canonicalize,cse,dce"
    assert effective(disabled=["planted-options"]) == "canonicalize,dce"  # not in the pipeline: no effect


def test_enable_forms(monkeypatch, capsys):
    assert effective(pipeline="canonicalize", enabled=["dce"]) == "canonicalize,dce"  # appended
    assert effective(enabled=["planted-options{ways=2}"]) == "canonicalize,cse,dce,planted-options{ways=2}"
    assert cli_effective(capsys, "-p", "cse", "--enable", "planted-options{ways=2}") == "cse,planted-options{ways=2}"
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "cse")
    assert effective(enabled=["cse"]) == "canonicalize,cse,dce"  # an explicit enable beats the environment
    assert cli_effective(capsys, "--enable", "cse") == "canonicalize,cse,dce"
    with pytest.raises(PipelineError, match="pass 'cse' is both enabled and disabled"):
        effective(enabled=["cse"], disabled=["cse"])


def test_default_off_entry_is_enabled_in_place(monkeypatch, capsys):
    monkeypatch.setattr(defaults, "DEFAULT_PIPELINE", (
        Entry("canonicalize", "first"), Entry("planted-options{ways=3}", "optional", enabled=False),
        Entry("dce", "last")))
    assert effective() == "canonicalize,dce"
    assert effective(enabled=["planted-options"]) == "canonicalize,planted-options{ways=3},dce"
    assert effective(enabled=["planted-options{ways=5}"]) == "canonicalize,planted-options{ways=5},dce"
    assert effective(only=["planted-options"]) == "planted-options{ways=3}"
    assert main(["opt", "--print-pipeline"]) == 0
    table = capsys.readouterr().out
    assert "# planted-options{ways=3}" in table and "[off by default (--enable to run it)] optional" in table


def test_only_forms(capsys):
    assert effective(only=["cse"]) == "cse"
    assert effective(only=["dce", "canonicalize"]) == "canonicalize,dce"  # pipeline order
    assert effective(only=["planted-options"]) == "planted-options"        # appended when missing
    assert cli_effective(capsys, "--only", "cse") == "cse"
    assert cli_effective(capsys, "--only", "cse", "--only", "dce") == "cse,dce"


def test_options_forms(capsys):
    base = dict(pipeline="cse,planted-options")
    assert effective(**base, options={"planted-options": {"ways": 8}}) == "cse,planted-options{ways=8}"
    assert effective(**base, options={"planted-options": {"ways": "8", "tiles": "[1,2]"}}) == \
        "cse,planted-options{ways=8,tiles=[1,2]}"
    flags = ("-p", "cse,planted-options", "--pass-option", "planted-options{ways=8,tiles=[1,2]}")
    assert cli_effective(capsys, *flags) == "cse,planted-options{ways=8,tiles=[1,2]}"
    with pytest.raises(PipelineError) as e:
        effective(**base, options={"planted-options": {"ways": "many"}})
    assert str(e.value) == "PassContext(options): planted-options: option 'ways' expects int, got many"


@pytest.mark.parametrize("kw, message", [
    (dict(disabled=["csee"]), "PassContext(disabled):1:1: unknown pass 'csee' (did you mean 'cse'?)"),
    (dict(only=["dce", "dcee"]), "PassContext(only):1:1: unknown pass 'dcee' (did you mean 'dce'?)"),
    (dict(enabled=["cse{x=1}"]), "PassContext(enabled):1:5: pass 'cse' has no option 'x' (it has no options)"),
    (dict(options={"csee": {}}), "PassContext(options): unknown pass 'csee' (did you mean 'cse'?)"),
])
def test_python_toggle_errors(kw, message):
    with pytest.raises(PipelineError) as e:
        effective(**kw)
    assert str(e.value) == message


def test_cli_and_env_toggle_errors(monkeypatch, capsys):
    assert main(["opt", "--print-pipeline", "--disable", "cse,dcee"]) == 2
    assert capsys.readouterr().err == "dspark: --disable:1:5: unknown pass 'dcee' (did you mean 'dce'?)\n"
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "canonicalise")
    assert main(["opt", "--print-pipeline"]) == 2
    assert capsys.readouterr().err == \
        "dspark: DSPARK_DISABLE_PASSES:1:1: unknown pass 'canonicalise' (did you mean 'canonicalize'?)\n"


def test_context_manager_is_the_default_for_run_pipeline():
    g = mini()
    with PassContext(disabled=["dce"]):
        assert PassContext.current().disabled == ("dce",)
        assert run_pipeline(g).pipeline.names == ["canonicalize", "cse"]
        with PassContext(only=["dce"]):
            assert run_pipeline(g).pipeline.names == ["dce"]  # the inner context replaces the outer
        assert run_pipeline(g).pipeline.names == ["canonicalize", "cse"]
    assert run_pipeline(g).pipeline.names == ["canonicalize", "cse", "dce"]


def test_cache_key_follows_the_effective_pipeline(monkeypatch):
    key = PassContext().cache_key()
    assert PassContext(disabled=["cse"]).cache_key() != key
    assert PassContext(pipeline="canonicalize,cse,dce").cache_key() == key
    assert PassContext(pipeline="cse,planted-options{ways=2}").cache_key() != \
        PassContext(pipeline="cse,planted-options{ways=3}").cache_key()
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "cse")
    assert PassContext().cache_key() == PassContext(disabled=["cse"]).cache_key()
    assert run_pipeline(mini()).cache_key == PassContext(disabled=["cse"]).cache_key()
