"""A task defined in a script run as ``__main__`` is named as the worker will know it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import warnings
warnings.simplefilter("error")
from tether import App

app = App("sqlite:///{db}")


@app.task
async def crawl(ctx, url):
    ...


print(crawl.name)
"""


def _run(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_script_run_directly_names_its_tasks_by_its_file(tmp_path: Path) -> None:
    (tmp_path / "mymodule.py").write_text(SCRIPT.format(db=tmp_path / "t.db"))
    # `tether worker --app mymodule:app` imports the file as mymodule: the same name.
    assert _run(tmp_path, "mymodule.py") == "mymodule.crawl"
    assert _run(tmp_path, "-c", "import mymodule") == "mymodule.crawl"


def test_a_module_run_with_dash_m_names_its_tasks_by_its_module(tmp_path: Path) -> None:
    pkg = tmp_path / "jobs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "crawler.py").write_text(SCRIPT.format(db=tmp_path / "t.db"))
    assert _run(tmp_path, "-m", "jobs.crawler") == "jobs.crawler.crawl"
    (pkg / "__main__.py").write_text(SCRIPT.format(db=tmp_path / "t.db"))
    # `python -m jobs` runs jobs/__main__.py, which a worker imports as jobs.__main__.
    assert _run(tmp_path, "-m", "jobs") == "jobs.__main__.crawl"
