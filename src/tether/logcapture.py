"""The ``logging`` module's records, inside a handler, go to its job's own log.

:func:`install` puts one :class:`JobLogHandler` on the root logger (once per process,
however many workers run in it; :func:`uninstall` takes it off with the last). A record
emitted while a handler runs, in its task or in its thread (where
:data:`tether.context.CURRENT` names the job), becomes a line of that job's log, as
``ctx.log`` would write it. The logging module's levels apply as always: a record its
logger does not pass never reaches a handler. tether's own records (loggers named
``tether...``) are the worker's, not the job's, and are left out. Records outside any
job are left to the other handlers; where there are none, the logging module's last
resort still prints warnings, as it would without this handler.
"""

from __future__ import annotations

import logging
import threading

from tether.context import CURRENT

_lock = threading.Lock()
_users = 0
_handler: JobLogHandler | None = None


class JobLogHandler(logging.Handler):
    """Turns a record emitted inside a handler into a line of its job's log."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        ctx = CURRENT.get()
        if ctx is None or record.name == "tether" or record.name.startswith("tether."):
            if ctx is None:
                self._last_resort(record)
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + self._formatter.formatException(record.exc_info)
            ctx.log(message, record.levelno)
        except Exception:
            self.handleError(record)

    def _last_resort(self, record: logging.LogRecord) -> None:
        """What the logging module does with a record no handler takes: this handler
        must not be the one that silences it."""
        resort = logging.lastResort
        if resort is None or record.levelno < resort.level:
            return
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return
            logger = logger.parent if logger.propagate else None
        resort.handle(record)


def install() -> None:
    """Send records emitted inside handlers to their jobs' logs (idempotent per user)."""
    global _users, _handler
    with _lock:
        _users += 1
        if _handler is None:
            _handler = JobLogHandler()
            logging.getLogger().addHandler(_handler)


def uninstall() -> None:
    """Undo one :func:`install`; the handler goes with the last."""
    global _users, _handler
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None
