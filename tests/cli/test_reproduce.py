"""The Reproduce command lines (dspark_cli.common.CommandLine): the exact text generated files and reports carry."""
import pytest

from dspark_cli.commands import ab, compile, lower
from dspark_cli.common import CommandLine
from dspark_cli.main import build_parser


def line(module, argv):
    return module.command_line(build_parser().parse_args(argv))


@pytest.mark.parametrize("argv, want", [
    (["compile", "decode-swa", "-o", "out"], "dspark compile decode-swa --config tiny -o out"),
    (["compile", "decode-csa", "--config", "flash", "--tp", "4", "--seq", "2", "-p", "cse,dce", "--disable", "cse",
      "--disable", "dce", "--no-check-numerics", "--cycles", "-o", "my out"],
     "dspark compile decode-csa --config flash --tp 4 --seq 2 -p cse,dce --disable cse --disable dce "
     "--no-check-numerics --cycles -o 'my out'"),
    (["compile", "g.dsir", "--tp", "2", "--check-numerics", "-o", "o"], "dspark compile g.dsir --check-numerics -o o"),
])
def test_compile_command_line(argv, want):
    assert line(compile, argv) == want


@pytest.mark.parametrize("argv, want", [
    (["lower", "moe", "--tp", "1", "--ep", "1", "--static", "--workers", "4", "-o", "o"],
     "dspark lower moe --config tiny --tp 1 --ep 1 --static -o o"),
    (["lower", "decode-swa", "--batch", "2", "-p", "deterministic-split-k{targets=all}", "--compile", "--cycles",
      "-o", "o"], "dspark lower decode-swa --config tiny --batch 2 -p 'deterministic-split-k{targets=all}' "
                  "--cycles --compile -o o"),
    (["lower", "x/tasks.json", "-p", "", "-o", "o"], "dspark lower x/tasks.json --config tiny -o o"),
])
def test_lower_command_line(argv, want):
    assert line(lower, argv) == want


@pytest.mark.parametrize("argv, want", [
    (["ab", "-o", "d"], "dspark ab --config flash --tp 4 --batch 16 --seq 8 --csa-context 256 --hca-context 0 "
                        "--source pypto -o d"),
    (["ab", "decode-hca", "--no-loo", "--no-aoi", "--no-steps", "--offline", "--pypto-program", "--passes", "cse",
      "--stage", "hca.*", "--dispatch-cycles", "930.0", "--workers", "3", "--no-plots", "-o", "d"],
     "dspark ab decode-hca --config flash --tp 4 --batch 16 --seq 8 --csa-context 256 --hca-context 0 --source pypto "
     "--passes cse --stage 'hca.*' --no-loo --no-aoi --no-steps --offline --pypto-program --dispatch-cycles 930 -o d"),
    (["ab", "--model", "legacy", "-o", "d"], "dspark ab --config flash --tp 4 --batch 16 --seq 8 --csa-context 256 "
                                             "--hca-context 0 --source pypto --model legacy -o d"),
    (["ab", "--block-model", "span", "-o", "d"], "dspark ab --config flash --tp 4 --batch 16 --seq 8 --csa-context 256 "
                                                 "--hca-context 0 --source pypto --block-model span -o d"),
    (["ab", "--block-issue", "grid", "-o", "d"], "dspark ab --config flash --tp 4 --batch 16 --seq 8 --csa-context 256 "
                                                 "--hca-context 0 --source pypto --block-issue grid -o d"),
])
def test_ab_command_line(argv, want):
    assert line(ab, argv) == want


def test_command_line_builder():
    built = CommandLine("x", "a b").option("--n", None).option("--m", 0).flag("--f", False).flag("--g", True)
    assert str(built.repeated("--r", ["1", "2"])) == "dspark x 'a b' --m 0 --g --r 1 --r 2"
