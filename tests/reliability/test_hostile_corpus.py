"""A corpus of every class of hostile input the front end once failed on (issue 22): each `dspark verify` ends in
exit 2 with one located line, within 2 s of CPU and 500 MB; the 10 MB inputs that are valid parse within the same
bounds; `show` output with control characters reads back; numerics on a huge graph refuse in one line."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from dspark_cli.main import main

EXAMPLE = (Path(__file__).parents[2] / "examples" / "rmsnorm_matmul_rope.dsir").read_text()
CPU_BUDGET_S = 2.0
MEMORY_BUDGET = 500 << 20
MB10 = 10_000_000


def node(attrs: str = "", result: str = "f32[T,4]", header: str = "<T = 16>(%x: bf16[T,4])") -> str:
    return f"graph @g{header} {{\n  %a = cast(%x) {{to = f32{attrs}}} : {result}\n  return %a\n}}\n"


def example(old: str, new: str) -> str:
    assert old in EXAMPLE
    return EXAMPLE.replace(old, new, 1)


REJECTED = {   # name → (text or a function making it: 10 MB texts are made when needed, what the one line says)
    "escape \\x": (node(', sched = "\\x"'), "2:37: bad escape '\\x' in a string"),
    "escape \\u12": (node(', sched = "\\u12"'), "2:37: bad escape '\\u' in a string"),
    "escape \\N{NOPE}": (node(', sched = "\\N{NOPE}"'), "2:37: bad escape '\\N' in a string"),
    "raw newline in a string": (node(', sched = "a\nb"'), "2:36: unterminated string"),
    "raw NUL in a string": (node(', sched = "a\x00b"'), "2:38: raw control character U+0000 in a string"),
    "list 500 deep": (node(", tile = " + "[" * 500 + "]" * 500), "2:28: attribute 'tile': list nested more than 16"),
    "graph attribute list 500 deep": (example('layer = "example"', "layer = " + "[" * 500 + "]" * 500),
                                      "9:32: attribute 'layer': list nested more than 16"),
    "10 MB of '['": (lambda: node(", tile = " + "[" * MB10), "2:1017: input nested too deeply"),
    "10 MB of '('": (lambda: node(", blocks = " + "(" * MB10), "input nested too deeply"),
    "10 MB sum": (lambda: node(", blocks = " + "T+" * (MB10 // 2) + "T"), "more than 10000 tokens without a %value"),
    "10 MB list": (lambda: node(", tile = [" + "1, " * (MB10 // 3) + "1]"), "more than 10000 tokens without a %value"),
    "10 MB name": (lambda: node(", " + "a" * MB10 + " = 1"), "2:28: name longer than 1024 characters"),
    "10 MB integer": (lambda: node(", blocks = " + "9" * MB10), "2:37: integer literal out of range"),
    "64 KB of whitespace in a statement": (node().replace("cast(%x)", "cast(%x)" + " " * 65536).replace(" : f32[T,4]", ""),
                                           "unexpected 'return'"),
    "128 KB of whitespace after return": ("graph @g<T = 16>(%x: bf16[T,4]) {\n  return" + " " * 131072 + "\n",
                                          "2:3: unexpected end of input"),
    "rank-0 matmul": ("graph @g(%x: bf16[], %w: bf16[]) {\n  %a = matmul(%x, %w) : f32[]\n  return %a\n}\n",
                      "2:3: node 'a': lhs must have rank 2, got bf16[]"),
    "zero-size o_lora": ("graph @g(%x: i8[4,0], %w: i8[8,8]) {\n  %a = o_proj_b(%x, %w) {group = 0} : i32[4,8]\n"
                         "  return %a\n}\n", "group 0 of width 0 is outside wo_b"),
    "rmsnorm of a rank-0 tensor": ("graph @g(%x: bf16[], %w: bf16[4]) {\n  %a = rmsnorm(%x, %w) : bf16[]\n"
                                   "  return %a\n}\n", "x must have at least one axis"),
    "ceil(T/(T-16)) at T = 16": (node(result="f32[ceil(T/(T-16)),4]"), "has a division by non-positive 0 at T = 16"),
    "blocks dividing by zero": (node(", blocks = ceil(T/(T-16))"), "attribute 'blocks': ceil(T/(T - 16)) has a"),
    "negative extent": (node(result="f32[T-32,4]", header="<T = 16>(%x: bf16[T-32,4])"), "extent T - 32 is -16"),
    "ranks = 2.0": (example('config = "tiny"', 'config = "tiny", ranks = 2.0'), "graph attribute 'ranks' must be"),
    "ranks = true": (example('config = "tiny"', 'config = "tiny", ranks = true'), "graph attribute 'ranks' must be"),
    "tp = \"x\"": (example('config = "tiny"', 'config = "tiny", tp = "x"'), "graph attribute 'tp' must be"),
    "blocks = 0": (node(", blocks = 0"), "attribute 'blocks' must be at least 1, got 0"),
    "blocks = -5": (node(", blocks = -5"), "attribute 'blocks' must be at least 1, got -5"),
    "blocks over an undeclared symbol": (node(", blocks = ceil(TT/4)"), "attribute 'blocks' uses undeclared symbol 'TT'"),
    "T = 0": (example("<T = 16>", "<T = 0>"), "symbol T = 0: a bound symbol must be at least 1"),
}

ACCEPTED = {   # name → a function making the text
    "10 MB string": lambda: node(', sched = "' + "a" * MB10 + '"'),
    "10 MB string of escapes": lambda: node(', sched = "' + "\\n" * (MB10 // 2) + '"'),
    "10 MB string, lark path": lambda: node(', sched = "' + "a" * MB10 + '"').replace("} :", "} # a comment\n :"),
    "10 MB comment": lambda: "#" + "x" * MB10 + "\n" + node(),
    "10 MB of whitespace in a statement": lambda: node().replace("cast(%x)", "cast(%x)" + " " * MB10),
}


def verify_cli(tmp_path, capsys, text) -> tuple[int, str, str, float, int]:
    path = tmp_path / "hostile.dsir"
    path.write_text(text() if callable(text) else text)
    tracemalloc.start()
    start = time.process_time()
    try:
        code = main(["verify", "-q", str(path)])
        cpu = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out, err = capsys.readouterr()
    return code, out, err, cpu, peak


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_hostile_input_is_one_located_line_exit_2(name, tmp_path, capsys):
    text, message = REJECTED[name]
    code, out, err, cpu, peak = verify_cli(tmp_path, capsys, text)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err[:300]
    assert err.startswith(f"dspark: {tmp_path / 'hostile.dsir'}:") and message in err, err[:300]
    assert cpu < CPU_BUDGET_S and peak < MEMORY_BUDGET, (cpu, peak >> 20)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_large_valid_input_parses_in_bounded_time_and_memory(name, tmp_path, capsys):
    code, out, err, cpu, peak = verify_cli(tmp_path, capsys, ACCEPTED[name])
    assert (code, out, err) == (0, "", "")
    assert cpu < CPU_BUDGET_S and peak < MEMORY_BUDGET, (cpu, peak >> 20)


def test_show_output_with_control_characters_reads_back(tmp_path, capsys):
    source = tmp_path / "in.dsir"
    source.write_text(example('layer = "example"', 'layer = "ex\\nample\\x00\\u2028"')
                      .replace("blocks = 2}", 'blocks = 2, sched = "a\\tb\\r\\x1b\\"q\\"\\\\"}'))
    shown = tmp_path / "shown.dsir"
    assert main(["show", str(source), "-o", str(shown)]) == 0
    assert 'layer = "ex\\nample\\x00\\u2028"' in shown.read_text()
    assert main(["verify", "-q", str(shown)]) == 0
    again = tmp_path / "again.dsir"
    assert main(["show", str(shown), "-o", str(again)]) == 0
    assert again.read_text() == shown.read_text()
    capsys.readouterr()


def test_numerics_on_a_huge_graph_refuse_in_one_line(tmp_path, capsys):
    path = tmp_path / "huge.dsir"
    path.write_text("graph @g<T = 16777216>(%x: bf16[T,256], %w: bf16[256,256]) {\n"
                    "  %a = matmul(%x, %w) : f32[T,256]\n  %b = cast(%a) {to = bf16} : bf16[T,256]\n  return %b\n}\n")
    tracemalloc.start()
    try:
        code = main(["opt", "--check-numerics", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1 and peak < MEMORY_BUDGET, err
    assert "graph '@g': its values would need 32 GiB over 1 rank(s) (T = 16777216), more than the 8 GiB" in err


def test_a_64_kb_whitespace_run_anywhere_parses_in_linear_time():
    """The fast path's regexes once backtracked quadratically on whitespace runs (64 KB: ~60 s)."""
    import re

    from dspark_ir import parse_module
    from dspark_ir.errors import DsparkError

    cuts = sorted({m.start() for m in re.finditer(r"\b|[^\w\s]", EXAMPLE)})
    parse_module(EXAMPLE, "warm.dsir")        # the grammar and the op modules load once
    slowest = 0.0
    for i in cuts:
        for run in (" " * 65536, "\n" * 65536):
            start = time.process_time()
            try:
                parse_module(EXAMPLE[:i] + run + EXAMPLE[i:], "ws.dsir")
            except DsparkError as e:
                assert "\n" not in str(e)
            slowest = max(slowest, time.process_time() - start)
    assert len(cuts) > 300 and slowest < 0.5, slowest
