"""The compile driver (lowering.compile) and the one kernel generator it uses (lowering.codegen.generate)."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

import lowering.codegen as codegen
import lowering.driver as driver
from dspark_ir import layers, print_graph
from lowering import Compiled, LoweringError, build_task_graph, compile, emit, lint
from lowering.lint import LintIssue, LintReport
from passes import PassContext, run_pipeline
from tests.lowering.conftest import load


def test_compile_a_layer_does_the_steps_in_order():
    ctx = PassContext(use_env=False, verify_each=False)
    c = compile("decode-swa", config="tiny", tp=1, pipeline="default", ctx=ctx)
    g = layers.build("decode-swa", config="tiny", tp=1)
    by_hand = run_pipeline(g, ctx=ctx)
    assert print_graph(c.input) == print_graph(g) and print_graph(c.graph) == print_graph(by_hand.graph)
    assert c.pipeline_key == by_hand.cache_key and [r.status for r in c.passes.runs] == [r.status for r in by_hand.runs]
    tg = build_task_graph(by_hand.graph)
    assert c.tg.deps_map() == tg.deps_map() and c.lint.summary() == lint(tg).summary()
    assert set(c.seconds) == {"passes", "lowering", "codegen"}
    assert list(c.sources) == [f"kernels/{t.kernel}.py" for t in tg.kernels] + ["orchestrate.py"]


@pytest.mark.parametrize("pipeline", [None, ""])
def test_no_pipeline_means_no_passes(pipeline):
    g = load("mlp")
    c = compile(g, pipeline=pipeline)
    assert c.passes is None and c.graph is g and c.input is g and c.pipeline_key is None


def test_templates_are_resolved_once_and_emit_only_writes(tmp_path, monkeypatch):
    calls = []
    real = codegen.find_template

    def counting(task, ranks=0):
        calls.append(task.id)
        return real(task, ranks)

    monkeypatch.setattr(codegen, "find_template", counting)
    c = compile("moe", config="tiny", tp=1, command="dspark lower moe -o out")
    assert sorted(calls) == [t.id for t in c.tg.kernels]          # each kernel task once, dummies never
    assert all(t.template == (c.templates[t.id] is not None) for t in c.tg.tasks)
    assert {t.op for t in c.tg.kernels if not t.template} == set(c.untemplated_ops)
    calls.clear()
    written = emit(c, tmp_path)
    assert calls == []                                              # emit computes nothing but the files' text
    for relative, text in c.sources.items():
        assert (tmp_path / relative).read_text() == text
        assert "# Reproduce: dspark lower moe -o out" in text
    assert len(written) == len(c.sources) + 2


def test_emit_of_a_bare_task_graph_equals_emit_of_its_compiled(tmp_path):
    g = load("mlp")
    emit(build_task_graph(g), tmp_path / "tg", command="dspark lower mlp.dsir -o out")
    emit(compile(g, command="dspark lower mlp.dsir -o out"), tmp_path / "c")
    for path in sorted((tmp_path / "tg").rglob("*")):
        if path.is_file():
            assert path.read_text() == (tmp_path / "c" / path.relative_to(tmp_path / "tg")).read_text()


def test_sources_are_generated_on_first_use_when_asked_to_wait():
    lazy = compile("decode-hca", config="tiny", tp=1, sources=False)
    assert lazy._sources is None
    assert lazy.sources == compile("decode-hca", config="tiny", tp=1).sources


def test_strict_raises_on_a_lint_error(monkeypatch):
    bad = LintReport([LintIssue("race", 0, 1, "t1 reads what t0 writes, no dep path")], hazards=1)
    monkeypatch.setattr(driver, "lint", lambda tg: bad)
    assert isinstance(compile(load("mlp")), Compiled)               # not strict: the report is the caller's
    with pytest.raises(LoweringError, match="the lowered deps fail the lint: race: t1 reads"):
        compile(load("mlp"), strict=True)


def test_a_layer_name_takes_the_layer_options():
    c = compile("moe", config="tiny", tp=1, ep=1, sources=False)
    assert c.graph.attributes["ep"] == 1 and c.tg.ranks == 1
    assert compile("moe", config="tiny", tp=1, sources=False).tg.ranks == 2           # the config's ep
    c = compile("decode-csa", config="tiny", tp=1, batch=2, seq=2, params={"max_context": 32}, sources=False)
    want = layers.build("decode-csa", config="tiny", tp=1, batch=2, seq=2, max_context=32)
    assert print_graph(c.graph) == print_graph(want)


# ---- the one kernel generator -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tasks():
    out = []
    for layer in ("decode-swa", "decode-csa", "decode-hca", "moe"):
        tg = compile(layer, config="tiny", tp=1, pipeline="default", ctx=PassContext(use_env=False),
                     sources=False).tg
        out += [(t, tg) for t in tg.kernels if not t.collective and codegen.template_of(t, tg) is not None]
    return out


def test_a_kernel_generated_under_another_name_differs_in_its_name_only(tiny_tasks):
    """The cost cache hashes every kernel generated under the name `kernel`: that must be the kernel file's
    function with its def line renamed (what the cache keys were made from), nothing else."""
    for t, tg in tiny_tasks:
        body = codegen.kernel_body(t)
        renamed = re.sub(rf"^def {re.escape(t.kernel)}\(", "def kernel(", body, count=1, flags=re.M)
        assert codegen.generate(t, codegen.template_of(t, tg), name="kernel") == renamed, t.name


def test_generate_with_the_rename_cache_equals_a_fresh_generation(tiny_tasks):
    """Every kernel twice, the second time under another name: the renamed copies equal fresh generations."""
    known: dict = {}
    again = [(replace(t, kernel=f"again_{i}"), tg) for i, (t, tg) in enumerate(tiny_tasks)]
    for t, tg in tiny_tasks + again:
        template = codegen.find_template(t, tg.ranks)
        assert codegen.generate(t, template, known=known) == codegen.generate(t, template), t.kernel
    assert any(isinstance(v, str) and v for v in known.values())    # some were renamed, not generated again


def test_inline_kernel_takes_the_generated_function_apart(tiny_tasks):
    for t, tg in tiny_tasks:
        k = codegen.inline_kernel(t, codegen.template_of(t, tg))
        spec = codegen.kernel_spec(t)
        assert k.source == codegen.kernel_body(t)
        assert list(k.params) == [p.name for p in spec.params()]
        head = k.source[:k.source.index("\n):\n") + 4]
        assert k.dynamic == {p for p in k.params if re.search(rf"^\s+{p}: pypto\.Tensor\(\[pypto\.DYNAMIC", head, re.M)}
        assert [line for line in k.source[len(head):].splitlines() if line.strip()] == list(k.statements)
        assert all(line.startswith("    ") for line in k.statements)


def test_inline_kernel_refuses_a_template_without_its_signature():
    tg = build_task_graph(load("mlp"))
    with pytest.raises(LoweringError, match="does not start with its kernel's signature"):
        codegen.inline_kernel(tg.tasks[0], lambda spec: "x = 1\n" + spec.signature() + "\n    pass\n")
