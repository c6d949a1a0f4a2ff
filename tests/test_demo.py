"""The demo lives outside the core import path and tells people how to reach ``tether``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.demo.command import TetherCommand, find_tether_command


def _demo_modules_after(statement: str) -> list[str]:
    """The ``tether.demo`` modules a fresh interpreter has loaded after ``statement``."""
    code = (
        f"{statement}\n"
        "import sys\n"
        "print(sorted(m for m in sys.modules if m == 'tether.demo' "
        "or m.startswith('tether.demo.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return eval(done.stdout)  # type: ignore[no-any-return]


def test_import_tether_loads_no_demo_code() -> None:
    assert _demo_modules_after("import tether") == []


def test_the_cli_imports_the_demo_only_when_tether_demo_runs() -> None:
    assert _demo_modules_after("import tether.cli") == []
    # The package itself imports cleanly on its own (it is `--app tether.demo:app`).
    assert "tether.demo" in _demo_modules_after("from tether.demo import app")


def _fake_venv(root: Path) -> Path:
    """A virtualenv's bin folder: an interpreter, the tether script and activate."""
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "tether", "activate"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_demo_names_the_venv_script_when_tether_is_not_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _fake_venv(tmp_path)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    found = find_tether_command()
    assert found == TetherCommand(run=".venv/bin/tether", activate=".venv/bin/activate")
    assert found.hint() == "(or run `source .venv/bin/activate` first, then plain `tether` works)"
    # From elsewhere, the path is absolute, so it still works when pasted.
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert find_tether_command().run == str(bin_dir / "tether")


def test_the_demo_says_plain_tether_when_it_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _fake_venv(tmp_path)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert find_tether_command() == TetherCommand()
    assert TetherCommand().hint() is None
