"""The README's example, as examples/quickstart.py, runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_quickstart_script_runs_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "job 1 succeeded: crawled 10 pages\n"
    assert (tmp_path / "tether.db").exists()


def test_the_readme_shows_the_quickstart_script_as_it_is() -> None:
    readme = (EXAMPLE.parents[1] / "README.md").read_text("utf-8")
    code = EXAMPLE.read_text("utf-8").split('"""\n\n', 1)[1]
    assert f"```python\n{code}```" in readme
