"""The two list parsers every command shares: names from a closed set (or 'all'), and
comma-separated integers."""

import pytest

from convprobe.errors import InvalidArgument
from convprobe.options import comma_integers, names_or_all

CHOICES = ("conv2d", "matmul", "einsum")


@pytest.mark.parametrize("value, expected", [
    ("all", CHOICES), (" all ", CHOICES), (["all"], CHOICES), ("matmul,conv2d", ("matmul", "conv2d")),
    ("matmul, matmul ,conv2d", ("matmul", "conv2d")), (["einsum"], ("einsum",)),
])
def test_names_are_taken_in_the_users_order_once(value, expected):
    assert names_or_all(value, CHOICES, "op") == expected


@pytest.mark.parametrize("value, received", [("", "''"), (",", "''"), ([], "''"), ("conv3d", "'conv3d'")])
def test_an_unknown_or_empty_choice_is_one_line_naming_the_allowed(value, received):
    with pytest.raises(InvalidArgument) as error:
        names_or_all(value, CHOICES, "op")
    assert str(error.value) == f"op must be one of conv2d, matmul, einsum, all; received {received}"


@pytest.mark.parametrize("value", ["conv2d,,matmul", "conv2d,", ["conv2d", " "]])
def test_an_empty_name_among_names_is_refused_not_dropped(value):
    with pytest.raises(InvalidArgument) as error:
        names_or_all(value, CHOICES, "op")
    shown = ",".join(value) if isinstance(value, list) else value
    assert str(error.value) == (f"op lists an empty name in {','.join(n.strip() for n in shown.split(','))!r}; "
                                f"give names from conv2d, matmul, einsum, all separated by single commas")


@pytest.mark.parametrize("value", ["conv2d,all", ["all", "matmul"], "all,all"])
def test_all_among_other_names_is_named_as_what_it_is(value):
    with pytest.raises(InvalidArgument) as error:
        names_or_all(value, CHOICES, "op")
    shown = ",".join(value) if isinstance(value, list) else value
    assert str(error.value) == (f"op 'all' names every one of conv2d, matmul, einsum and stands alone; received "
                                f"{shown!r}: give all, or list names")


@pytest.mark.parametrize("text, expected", [("8,32,32,16", (8, 32, 32, 16)), ("3", (3,)), (" 2 , 2", (2, 2)),
                                            ("-1,0", (-1, 0)), ("", None), ("8,,3", None), ("2.5", None),
                                            ("x", None), ("3,", None)])
def test_comma_integers_are_all_integers_or_none(text, expected):
    assert comma_integers(text) == expected
