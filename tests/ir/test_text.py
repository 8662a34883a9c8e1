"""Text form: print → parse → structurally equal → print byte-identical; located parse errors."""
from pathlib import Path

import pytest
from hypothesis import given, settings

from dspark_ir import ParseError, parse_graph, print_graph, verify

from .strategies import graphs

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.dsir"))


@settings(max_examples=150)
@given(graphs())
def test_round_trip_generated(g):
    verify(g)
    text = print_graph(g)
    again = parse_graph(text)
    assert again.structurally_equal(g)
    assert print_graph(again) == text
    verify(again)
    assert again.structural_hash() == g.structural_hash()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip(path):
    g = parse_graph(path.read_text(), str(path))
    verify(g)
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text


def test_clone_is_structurally_equal_and_independent():
    g = parse_graph(EXAMPLES[0].read_text())
    c = g.clone()
    assert c.structurally_equal(g)
    node = next(iter(c.nodes.values()))
    node.attrs["aer"] = not node.attrs.get("aer", False)      # a change whatever the example's first node holds
    assert not c.structurally_equal(g)


GOOD = """graph @g<T = 16>(%x: bf16[T,64], %w: bf16[64]) {
  %a.n = rmsnorm(%x, %w) : bf16[T,64]
  return %a.n
}
"""


@pytest.mark.parametrize("text, where, message", [
    (GOOD.replace(" : bf16[T,64]\n", "\n"), "3:3", "unexpected 'return'; expected one of"),
    (GOOD.replace("bf16[T,64]", "bf17[T,64]", 1), "1:22", "unexpected 'bf17'; expected one of 'token', a dtype"),
    (GOOD.replace("rmsnorm", "rmsnrom"), "2:10", "unknown op 'rmsnrom' (did you mean 'rmsnorm'?)"),
    (GOOD.replace("(%x, %w)", "(%x, %ww)"), "2:22", "use of undefined value '%ww' (did you mean 'w'?)"),
    (GOOD.replace(" : bf16[T,64]\n  return", " {epz = 1.0} : bf16[T,64]\n  return"), "2:27",
     "unknown attribute 'epz' for op 'rmsnorm' (did you mean 'eps'?)"),
    (GOOD.replace(" : bf16[T,64]\n  return", " {eps = [1]} : bf16[T,64]\n  return"), "2:27", "expects float"),
    (GOOD.replace("%a.n = rmsnorm", "%x = rmsnorm"), "2:3", "defined twice"),
    (GOOD[:-3], "3:10", "unexpected end of input; expected one of ',', '}'"),
    (GOOD.replace("[T,64]", "[T/2,64]", 1), "1:27", "only allowed inside ceil"),
    (GOOD.replace("<T = 16>", "<T = 16, T = 4>"), "1:18", "symbol 'T' declared twice"),
    ("", "1:1", "unexpected end of input"),
    ("graph @g() {\n  return\n}\n\x00", "4:1", "unexpected character"),
])
def test_parse_errors_are_located(text, where, message):
    with pytest.raises(ParseError) as e:
        parse_graph(text, "t.dsir")
    rendered = str(e.value)
    assert rendered.startswith(f"t.dsir:{where}"), rendered
    assert message in rendered
    assert "\n" not in rendered


def test_forward_references_are_allowed_and_printed_in_topological_order():
    text = """graph @g<T = 16>(%x: bf16[T,64], %w: bf16[64]) {
  %b.two = rmsnorm(%b.one, %w) : bf16[T,64]
  %b.one = rmsnorm(%x, %w) : bf16[T,64]
  return %b.two
}
"""
    printed = print_graph(parse_graph(text))
    assert printed.index("%b.one =") < printed.index("%b.two =")


def test_a_misspelt_dtype_gets_a_did_you_mean():
    with pytest.raises(ParseError) as e:
        parse_graph(GOOD.replace("bf16[T,64]", "bf61[T,64]", 1), "f.dsir")
    assert str(e.value) == "f.dsir:1:22: unexpected 'bf61'; expected one of 'token', a dtype (did you mean 'bf16'?)"


@pytest.mark.parametrize("text, where, closer", [
    ("graph @g<T = 16>(\n    %x: bf16[T,64\n) {\n  return %x\n}\n", "2:18", "']'"),
    ("graph @g<T = 16>(\n    %x: bf16[T,64]\n {\n  return %x\n}\n", "2:19", "')'"),
])
def test_a_missing_closing_bracket_is_reported_where_it_is_missing(text, where, closer):
    with pytest.raises(ParseError) as e:
        parse_graph(text, "f.dsir")
    assert str(e.value).startswith(f"f.dsir:{where}: missing {closer} (found ")
