"""Payload encoding: what both stores can keep."""

from __future__ import annotations

import json

import pytest

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
