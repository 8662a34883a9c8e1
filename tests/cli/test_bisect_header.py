"""--bisect-limit: the output's header and cache key describe the truncated pipeline that produced the graph."""
from dspark_cli.main import main


def header(tmp_path, capsys, *argv) -> str:
    out = tmp_path / "o.dsir"
    assert main(["opt", "decode-swa", "--no-env", *argv, "-o", str(out)]) == 0
    capsys.readouterr()
    return out.read_text().splitlines()[0]


def test_bisect_limit_header_is_the_pipeline_that_ran(tmp_path, capsys):
    limited = header(tmp_path, capsys, "--bisect-limit", "4")
    explicit = header(tmp_path, capsys, "-p", "canonicalize,cse,topk-merge-stage,topk-bypass")
    full = header(tmp_path, capsys)
    assert limited == explicit and limited != full
    assert "split-writeback-bias" not in limited


def test_bisect_rewrites_header_names_the_rewrite_budget(tmp_path, capsys):
    limited = header(tmp_path, capsys, "--bisect-limit", "2", "--bisect-rewrites")
    assert "--bisect-limit 2 --bisect-rewrites" in limited
    assert limited.split("cache key ")[1] != header(tmp_path, capsys).split("cache key ")[1]
