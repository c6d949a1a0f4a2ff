"""The lines of a job's own log before they are stored (:mod:`tether.joblog`)."""

from __future__ import annotations

import logging

import pytest

from tether.joblog import MAX_MESSAGE_CHARS, level_name, pending


def test_levels_come_from_names_and_from_the_logging_module() -> None:
    assert level_name("INFO") == "info" and level_name("warn") == "warning"
    assert level_name(logging.DEBUG) == "debug" and level_name(logging.ERROR) == "error"
    assert level_name(logging.WARNING + 5) == "warning"
    assert level_name(logging.CRITICAL) == "critical" and level_name(5) == "debug"
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        level_name("loud")


def test_a_line_is_text_cut_at_the_longest_message_and_sized_in_utf8() -> None:
    line = pending({"n": 1}, "info", 12.5)
    assert (line.at, line.level, line.message) == (12.5, "info", "{'n': 1}")
    assert pending("é", "info", 0).size == 2
    long = pending("x" * (MAX_MESSAGE_CHARS + 10), "error", 0)
    assert long.message == "x" * MAX_MESSAGE_CHARS + " [cut]"
