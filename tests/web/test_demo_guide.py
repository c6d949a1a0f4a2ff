"""The dashboard's demo guide."""

from __future__ import annotations

import re

from .support import Client


async def test_the_demo_guide_says_how_to_reach_tether_after_make_demo(authed: Client) -> None:
    http = authed.http
    login = await http.get("/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert nonce is not None
    token = (authed.tokens or {})["eve"]  # a viewer sees the guide too
    assert (await http.post("/login", data={"token": token, "csrf": nonce.group(1)})).is_redirect
    page = await http.get("/demo")
    assert page.status_code == 200, page.text
    # After `make demo`, a bare `tether` is "command not found".
    assert ".venv/bin/tether worker --app tether.demo:app" in page.text
    assert "source .venv/bin/activate" in page.text
