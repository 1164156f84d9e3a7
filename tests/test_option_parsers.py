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


EMPTY = "op lists an empty name in {!r}; give names from conv2d, matmul, einsum, all separated by single commas"
ALL = "op 'all' names every one of conv2d, matmul, einsum and stands alone; received {!r}: give all, or list names"


@pytest.mark.parametrize("value, shown, message", [
    ("conv2d,,matmul", "conv2d,,matmul", EMPTY), ("conv2d,", "conv2d,", EMPTY), (["conv2d", " "], "conv2d,", EMPTY),
    ("conv2d,all", "conv2d,all", ALL), (["all", "matmul"], "all,matmul", ALL), ("all,all", "all,all", ALL),
])
def test_an_empty_name_or_all_among_names_is_named_as_what_it_is(value, shown, message):
    with pytest.raises(InvalidArgument) as error:
        names_or_all(value, CHOICES, "op")
    assert str(error.value) == message.format(shown)


@pytest.mark.parametrize("text, expected", [("8,32,32,16", (8, 32, 32, 16)), ("3", (3,)), (" 2 , 2", (2, 2)),
                                            ("-1,0", (-1, 0)), ("", None), ("8,,3", None), ("2.5", None),
                                            ("x", None), ("3,", None)])
def test_comma_integers_are_all_integers_or_none(text, expected):
    assert comma_integers(text) == expected
