"""String attribute values: one syntax with explicit escapes; the printer escapes what is not printable, so any
string prints and reads back (on the fast path and on the lark grammar); bad escapes and raw control characters
are one-line errors at the character."""
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_ir import Graph, ParseError, TensorType, parse_graph, print_graph, verify
from dspark_ir.text.strings import TOKEN, quote, unquote


def graph_with(text: str) -> Graph:
    g = Graph("g", {"T": 16}, {"note": text})
    x = g.add_param("x", TensorType.of("bf16", ["T", 4]))
    g.set_returns([g.add_op("cast", [x], {"to": "f32", "sched": text}, names="a").result])
    return g


def on_the_lark_path(text: str) -> str:
    """The same graph in a layout the fast path leaves to the lark grammar (a comment inside a statement)."""
    assert "} : f32" in text
    return text.replace("} : f32", "} # lark\n : f32")


@settings(max_examples=300)
@given(st.text())
def test_any_string_prints_and_reads_back(value):
    g = graph_with(value)
    text = print_graph(g, header=[f"note {value}"])
    for source in (text, on_the_lark_path(text)):
        again = parse_graph(source)
        verify(again)
        assert again.attributes["note"] == value and again.nodes["a"].attrs["sched"] == value
        assert print_graph(again, header=[f"note {value}"]) == text


@pytest.mark.parametrize("value, printed", [
    ("late_dep", '"late_dep"'), ('a "b" \\ c', '"a \\"b\\" \\\\ c"'), ("a\nb\tc\r", '"a\\nb\\tc\\r"'),
    ("\x00\x7f\x1b", '"\\x00\\x7f\\x1b"'), ("\u2028é", '"\\u2028é"'), ("\U000e0001", '"\\U000e0001"'),
])
def test_quote(value, printed):
    assert quote(value) == printed and unquote(printed) == value


def test_the_grammar_and_the_fast_path_lex_strings_alike():
    grammar = (Path(__file__).parents[2] / "dspark_ir" / "text" / "dsir.lark").read_text()
    assert f"STRING: /{TOKEN}/" in grammar


SOURCE = 'graph @g<T = 16>(%x: bf16[T,4]) {\n  %a = cast(%x) {to = f32, sched = SCHED} : f32[T,4]\n  return %a\n}\n'


@pytest.mark.parametrize("sched, message", [
    ('"\\x"', "2:37: bad escape '\\x' in a string"),
    ('"ab\\u12"', "2:39: bad escape '\\u' in a string"),
    ('"\\N{NOPE}"', "2:37: bad escape '\\N' in a string"),
    ('"\\U00110000"', "2:37: escape '\\U00110000' is beyond U+10FFFF"),
    ('"a\x00b"', "2:38: raw control character U+0000 in a string (write it as \\x00)"),
    ('"a\tb"', "2:38: raw control character U+0009 in a string (write it as \\t)"),
    ('"a\nb"', "2:36: unterminated string"),
    ('"a\\\nb"', "2:36: unterminated string"),
])
@pytest.mark.parametrize("path", ["fast", "lark"])
def test_bad_strings_are_located_one_line_errors(sched, message, path):
    text = SOURCE.replace("SCHED", sched)
    with pytest.raises(ParseError) as e:
        parse_graph(text if path == "fast" else on_the_lark_path(text), "s.dsir")
    assert str(e.value).startswith("s.dsir:" + message) and "\n" not in str(e.value)


def test_deep_lists_are_a_located_error():
    text = SOURCE.replace("sched = SCHED", "tile = " + "[" * 500 + "]" * 500)
    with pytest.raises(ParseError) as e:
        parse_graph(text, "s.dsir")
    assert str(e.value) == "s.dsir:2:28: attribute 'tile': list nested more than 16 levels deep"
