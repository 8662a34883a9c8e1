"""Option ranges declared with the option (`ways: int = option(4, min=1)`): every way of giving a value outside
the range is one error that names the option and its range; `dspark help PASS` / `list passes -v` show them."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from dspark_cli.main import main
from passes import Pass, PassContext, PipelineError, describe, get_pass, option, parse_pipeline, registered_names
from passes.infra.options import option_specs


@pytest.mark.parametrize("text, message", [
    ("split-m-fanout{ways=0}", "pipeline:1:16: split-m-fanout: option 'ways' must be >= 1, got 0"),
    ("split-m-fanout{ways=-2}", "pipeline:1:16: split-m-fanout: option 'ways' must be >= 1, got -2"),
    ("quant-workers{workers=0}", "pipeline:1:15: quant-workers: option 'workers' must be >= 1, got 0"),
    ("dequant-workers{workers=0}", "option 'workers' must be >= 1, got 0"),
    ("fuse-merge-rope-pack{workers=-1}", "option 'workers' must be >= 1, got -1"),
    ("pool-fanout{requests=0}", "option 'requests' must be >= 1, got 0"),
    ("widen-tile{factor=1}", "option 'factor' must be >= 2, got 1"),
    ("tile-choice{min_gain=0.5}", "option 'min_gain' must be >= 1, got 0.5"),
    ("split-writeback-bias{tile_rows=-8}", "option 'tile_rows' must be >= 0, got -8"),
])
def test_out_of_range_in_a_pipeline_string(text, message):
    with pytest.raises(PipelineError) as e:
        parse_pipeline(text)
    assert message in str(e.value)


def test_in_range_values_still_build():
    assert str(parse_pipeline("split-m-fanout{ways=1},split-writeback-bias{tile_rows=0},quant-workers{workers=1}")) \
        == "split-m-fanout{ways=1},split-writeback-bias,quant-workers{workers=1}"     # 0 is the default


def test_out_of_range_from_python_and_context():
    with pytest.raises(ValueError, match="option 'ways' must be >= 1, got 0"):
        get_pass("split-m-fanout")(ways=0)
    with pytest.raises(PipelineError, match="PassContext\\(options\\): split-m-fanout: option 'ways' must be >= 1"):
        PassContext(use_env=False, options={"split-m-fanout": {"ways": 0}}).effective_pipeline()


@pytest.mark.parametrize("flags", [
    ["-p", "split-m-fanout{ways=0}"], ["-p", "split-m-fanout{ways=-2}"],
    ["--pass-option", "quant-workers{workers=0}"], ["--enable", "fuse-merge-rope-pack{workers=0}"],
])
def test_cli_one_line_exit_2(flags, capsys):
    assert main(["opt", "decode-swa", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be >= 1, got" in err and "Traceback" not in err


def test_range_of_a_list_and_bad_declarations():
    @dataclass(frozen=True)
    class Tiles(Pass):
        """test only"""

        name = "ranged-tiles-test"
        tiles: tuple[int, ...] = option((8, 16), min=1, max=64)

    spec = option_specs(Tiles)["tiles"]
    assert spec.range_text == "in [1, 64]"
    with pytest.raises(ValueError, match="every item of option 'tiles' must be in \\[1, 64\\], got \\[8,128\\]"):
        Tiles(tiles=(8, 128))

    @dataclass(frozen=True)
    class Bad(Pass):
        """test only"""

        name = "ranged-bad-test"
        label: str = option("x", min=1)

    with pytest.raises(TypeError, match="a range needs a number"):
        option_specs(Bad)


def test_every_builtin_pass_declares_its_origin_and_describes_itself():
    for name in registered_names():
        cls = get_pass(name)
        if cls.__module__.startswith("passes."):
            assert cls.origin, name
    text = describe("split-m-fanout")
    assert "origin:     seed PR" in text and "contract:   bitwise" in text
    assert "ways (int, >= 1; default 4)" in text
    assert "pipeline:   in the default pipeline, off by default (--enable)" in describe("retiled-cse")


def test_help_and_list_verbose(capsys):
    assert main(["help", "quant-workers"]) == 0
    out = capsys.readouterr().out
    assert "workers (int, >= 1; default 24)" in out and "origin:     a later public pypto-lib form" in out
    assert "Before (the seed)" in out                      # the docstring follows
    assert main(["list", "passes", "-v"]) == 0
    out = capsys.readouterr().out
    assert all(f"{n}: " in out for n in ("canonicalize", "split-m-fanout", "moe-handshake-deps"))
    assert main(["help", "spilt-m-fanout"]) == 2
    assert "did you mean 'split-m-fanout'" in capsys.readouterr().err
    assert main(["help", "opt"]) == 0
    assert "usage: dspark opt" in capsys.readouterr().out
