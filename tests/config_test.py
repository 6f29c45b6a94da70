import pytest

from skilljax.config import parse_arg


def test_parse_arg_types_and_flags():
    c = parse_arg("model=small,runlocal,steps=20,lr=0.5,eval=false",
                  model="tiny", runlocal=False, steps=100, lr=1e-3, eval=True)
    assert (c.model, c.runlocal, c.steps, c.lr, c.eval) == ("small", True, 20, 0.5, False)
    assert parse_arg(None, steps=3).steps == 3


def test_parse_arg_errors():
    with pytest.raises(ValueError, match="Unknown config argument 'stepz'"):
        parse_arg("stepz=1", steps=1)
    with pytest.raises(ValueError, match="needs a value"):
        parse_arg("steps", steps=1)
    lazy = parse_arg("extra=3,name=abc", lazy=True)
    assert (lazy.extra, lazy.name) == (3, "abc")
