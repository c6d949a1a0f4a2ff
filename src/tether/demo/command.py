"""How another terminal reaches the ``tether`` command, for the demo's instructions.

After ``make demo`` in a clone of tether, the command lives in ``.venv/bin`` and is not on
``PATH``: a bare ``tether worker ...`` says "command not found". The demo therefore
prints the command as this terminal would reach it.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TetherCommand:
    """What to type for ``tether`` in another terminal in the same directory."""

    run: str = "tether"
    """``tether`` when it is on ``PATH``, else the script's path (``.venv/bin/tether``)."""
    activate: str | None = None
    """The virtualenv's activate script, when sourcing it first puts ``tether`` on ``PATH``."""

    def hint(self) -> str | None:
        """One line saying how to get a plain ``tether``, or None when it already works."""
        if self.activate is None:
            return None
        return f"(or run `source {self.activate}` first, then plain `tether` works)"


def find_tether_command() -> TetherCommand:
    """How another terminal in the current directory runs this installation's ``tether``.

    The ``tether`` script sits next to the interpreter running it. If the first ``tether``
    on ``PATH`` is that script, ``tether`` it is; otherwise its path, relative to the
    current directory when it lies below it.
    """
    bin_dir = Path(sys.executable).parent
    script = bin_dir / "tether"
    if not script.is_file():
        return TetherCommand()  # not a script install (e.g. ``python -m``): say ``tether``
    on_path = shutil.which("tether")
    if on_path is not None and os.path.samefile(on_path, script):
        return TetherCommand()
    activate = bin_dir / "activate"
    return TetherCommand(
        run=_shown(script), activate=_shown(activate) if activate.is_file() else None
    )


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is below it, else absolute."""
    absolute = path.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)
