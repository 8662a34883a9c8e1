import pytest
from hypothesis import given

from dspark_ir.dims import Const, Sym, ceildiv, dim, dmin
from dspark_ir.errors import ParseError

from .strategies import dims


@pytest.mark.parametrize("text, value", [
    ("ceil(T/8)", 16), ("T*4 + 1", 513), ("T // 16 * 4", 32), ("min(T, 100)", 100), ("max(2, ceil((T + 16)/128))", 2),
    ("T - 8", 120), ("(T + 1)*2", 258),
])
def test_parse_and_evaluate(text, value):
    assert dim(text).value({"T": 128}) == value


def test_constants_fold_and_identities():
    assert dim("4*8 + 1") == Const(33)
    assert dim("T*1 + 0") == Sym("T")
    assert ceildiv(100, 8) == Const(13)
    assert dmin("T", "T") == Sym("T")
    assert dim("T").value({}) is None


@given(dims())
def test_print_parse_round_trip(d):
    assert dim(str(d)) == d
    assert str(dim(str(d))) == str(d)


@given(dims())
def test_evaluation_matches_python(d):
    env = {"T": 128, "B": 16, "S": 8}
    folded = dim(str(d)).value(env)
    assert folded == d.value(env)


@pytest.mark.parametrize("text, message", [
    ("T/8", "only allowed inside ceil"), ("ceil(T)", "a/b"), ("floor(T/2)", "unknown dim function"),
    ("T //", "unexpected end"), ("T // 0", "non-positive"),
])
def test_bad_dims_are_located(text, message):
    with pytest.raises(ParseError) as e:
        dim(text)
    assert message in str(e.value)
    assert str(e.value).startswith("<dim>:")
