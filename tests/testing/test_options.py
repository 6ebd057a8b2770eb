"""Harness layer 0 (no process group): the option parsers and the plugin's messages built on them.

Every valid and invalid value of :mod:`nemo_dist.testing.options` in one
place, each case with a readable id; nothing here starts a process.
"""

from __future__ import annotations

import pickle

import pytest

from nemo_dist.testing import options, plugin
from nemo_dist.testing.options import BadOptionValue


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,2,3,4", (1, 2, 3, 4)),
        ("8", (8,)),
        ("4,2,4,1,2", (4, 2, 1)),
        (" 2 , 3 ", (2, 3)),
    ],
    ids=["default", "one", "duplicates-dropped-order-kept", "spaces"],
)
def test_parse_world_sizes_accepts(text: str, expected: tuple[int, ...]) -> None:
    """Comma-separated ints >= 1 parse in order, each size once."""
    assert options.parse_world_sizes(text) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,x", "x"),
        ("0", "0"),
        ("2,-1", "-1"),
        ("1,,2", ""),
        ("2.5", "2.5"),
        ("", ""),
    ],
    ids=["not-int", "zero", "negative", "empty-item", "fraction", "empty"],
)
def test_parse_world_sizes_rejects(text: str, value: str) -> None:
    """A bad item raises BadOptionValue naming the item (value) and the whole list (text)."""
    with pytest.raises(BadOptionValue) as info:
        options.parse_world_sizes(text)
    assert (info.value.value, info.value.text) == (value, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("120", 120.0), ("1.5", 1.5), ("1e-3", 0.001), (" 7 ", 7.0)],
    ids=["int", "fraction", "exponent", "spaces"],
)
def test_parse_seconds_accepts(text: str, expected: float) -> None:
    """Finite numbers > 0 parse as float seconds."""
    assert options.parse_seconds(text) == expected


@pytest.mark.parametrize(
    "text",
    ["soon", "0", "-3", "inf", "nan", ""],
    ids=["not-number", "zero", "negative", "infinite", "nan", "empty"],
)
def test_parse_seconds_rejects(text: str) -> None:
    """Anything but a finite number > 0 raises BadOptionValue carrying the text."""
    with pytest.raises(BadOptionValue) as info:
        options.parse_seconds(text)
    assert (info.value.value, info.value.text) == (text, text)


@pytest.mark.parametrize(("text", "expected"), [("1", 1), (" 16 ", 16)], ids=["one", "spaces"])
def test_parse_positive_int_accepts(text: str, expected: int) -> None:
    """An int >= 1 parses."""
    assert options.parse_positive_int(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "1.0", "x", ""], ids=["zero", "negative", "fraction", "word", "empty"])
def test_parse_positive_int_rejects(text: str) -> None:
    """Anything but an int >= 1 raises BadOptionValue carrying the text."""
    with pytest.raises(BadOptionValue) as info:
        options.parse_positive_int(text)
    assert info.value.value == text


@pytest.mark.parametrize(("text", "expected"), [("0", 0), (" 4 ", 4)], ids=["zero", "spaces"])
def test_parse_count_accepts(text: str, expected: int) -> None:
    """An int >= 0 parses (NEMO_DIST_FAKE_GPU_COUNT=0 means no CUDA)."""
    assert options.parse_count(text) == expected


@pytest.mark.parametrize("text", ["-1", "1.5", "two", ""], ids=["negative", "fraction", "word", "empty"])
def test_parse_count_rejects(text: str) -> None:
    """Anything but an int >= 0 raises BadOptionValue carrying the text."""
    with pytest.raises(BadOptionValue) as info:
        options.parse_count(text)
    assert info.value.value == text


def test_bad_option_value_is_a_value_error_that_pickles() -> None:
    """BadOptionValue is a ValueError, says what was bad and survives pickling with its fields."""
    error = BadOptionValue("x", "1,x")
    assert isinstance(error, ValueError)
    assert str(error) == "bad value 'x' in '1,x'"
    again = pickle.loads(pickle.dumps(error))
    assert (again.value, again.text, str(again)) == ("x", "1,x", str(error))


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (
            plugin._parse_sizes,
            "1,x",
            "--dist-world-sizes expects a comma-separated list of world sizes >= 1, "
            "such as --dist-world-sizes=1,2,4; got '1,x'",
        ),
        (
            plugin._parse_sizes,
            "0",
            "--dist-world-sizes expects a comma-separated list of world sizes >= 1, "
            "such as --dist-world-sizes=1,2,4; got '0'",
        ),
        (
            plugin._parse_timeout,
            "soon",
            "--dist-timeout expects a number of seconds > 0, such as --dist-timeout=120; got 'soon'",
        ),
        (
            plugin._parse_timeout,
            "inf",
            "--dist-timeout expects a number of seconds > 0, such as --dist-timeout=120; got 'inf'",
        ),
    ],
    ids=["sizes-not-int", "sizes-zero", "timeout-not-number", "timeout-infinite"],
)
def test_plugin_words_each_bad_value_as_a_usage_error(parse: object, text: str, message: str) -> None:
    """The plugin turns BadOptionValue into a UsageError naming its option and the whole value."""
    with pytest.raises(pytest.UsageError) as info:
        parse(text)  # type: ignore[operator]
    assert str(info.value) == message
