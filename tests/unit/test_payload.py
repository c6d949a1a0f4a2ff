"""Payload encoding: what both stores can keep."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import payload


def test_encode_is_compact_json_that_reads_back() -> None:
    value = {"a": [1, 2.5, None, True], "s": "häkel ☃ \\u0000 literal"}
    text = payload.encode(value)
    assert json.loads(text) == value and ", " not in text


@pytest.mark.parametrize("value", [{"x": "a\x00b"}, ["\x00"], {"k\x00": 1}, {"s": "\\\x00"}])
def test_a_nul_character_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="NUL"):
        payload.encode(value)


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": {1, 2}}, object()])
def test_what_is_not_json_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        payload.encode(value)


def test_printable_shows_nul_characters() -> None:
    assert payload.printable("bad \x00 byte") == "bad \\x00 byte"


# Nested lists and objects whose strings hold brackets, quotes and escapes of their own.
_TEXT = st.text(alphabet='[]{}"\\ab,:', max_size=6)
_JSON = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=30,
)


@given(_JSON, st.integers(min_value=0, max_value=8))
def test_the_text_scan_finds_the_depth_the_parsed_value_has(value: object, limit: int) -> None:
    text = json.dumps(value)
    assert payload.text_depth_over(text, limit) == payload.depth_over(value, limit)
    assert payload.text_depth_over(text.encode(), limit) == payload.depth_over(value, limit)


def test_the_text_scan_needs_no_stack_for_any_depth() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    assert payload.text_depth_over(deep)
    assert payload.text_depth_over("[" * 200_000)  # unclosed: a parser would still recurse
    assert not payload.text_depth_over('["' + "[" * 200_000 + '"]')  # only a string
