"""Writes the REST API's OpenAPI schema next to its reference page before each build.

The schema is generated from the FastAPI app itself, so the reference can never drift
from the routes. No database is opened: building the schema only reads the routes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def on_pre_build(config: Any) -> None:
    from tether import App
    from tether.web.app import create_app

    api = create_app(App("sqlite:///unused-by-the-docs-build.db"))
    target = Path(config["docs_dir"]) / "reference" / "openapi.json"
    target.write_text(json.dumps(api.openapi(), indent=1, sort_keys=True), "utf-8")
