"""A page one user serves, opened by another: with one origin per user (the demo's and the site template's hub), its
script cannot read the hub's pages or get a token as whoever opened it. The control runs the same page against the
hub with every server on the hub's own origin (JupyterHub's default): there it takes the visitor's account.

Real hub, proxy, Slurm and sudo; real Chromium. bob serves the page the way any user can: a static folder named in
his own ~/.jupyter config, which his notebook server (a Slurm job) serves without asking who looks."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.hub import BOB, USER, Hub, as_user, demo_config_with, ensure_user, logged_in_page
from helpers.record import attack

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PROFILE = {"profile": "1 node, 1 GPU (debug)"}
PAGE = "hpcai-take-over.html"
# bob's script: read the hub's home page for the visitor's name and XSRF token, then ask the hub for a token as
# them; at the hub's own origin and at the page's, whichever answers. What it got is written into the page.
SCRIPT = """
<html><body>waiting</body><script>
(async () => {
  const found = {tried: []};
  for (const hub of [HUB, ""]) {
    try {
      const home = await (await fetch(hub + "/hub/home", {credentials: "include"})).text();
      const xsrf = (home.match(/xsrf_token:\\s*"([^"]+)"/) || [])[1];
      const user = (home.match(/user:\\s*"([^"]+)"/) || [])[1];
      found.tried.push({hub, user: user || null, xsrf: Boolean(xsrf)});
      if (!user || !xsrf) continue;
      const made = await fetch(hub + "/hub/api/users/" + user + "/tokens", {method: "POST", credentials: "include",
        headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"}, body: JSON.stringify({note: "bob's"})});
      const body = await made.json();
      if (body.token) { found.token = body.token; found.user = user; break; }
      found.tried.push({hub, refused: made.status});
    } catch (err) { found.tried.push({hub, error: String(err)}); }
  }
  document.body.textContent = JSON.stringify(found);
  document.title = "done";
})();
</script></html>
"""


def _serve_page(hub: Hub) -> None:
    """bob's server, running, serving SCRIPT at static/PAGE: a folder named in his own Jupyter config."""
    folder = f"/home/{BOB}/.hpcai-test-static"
    config = f"/home/{BOB}/.jupyter/jupyter_server_config.py"
    page = SCRIPT.replace("HUB", json.dumps(hub.url))
    setting = f"c.ServerApp.extra_static_paths = [{folder!r}]\n"
    made = as_user(BOB, "bash", "-c", f"mkdir -p {folder} ~/.jupyter && printf %s {shlex.quote(page)} > {folder}/{PAGE}"
                   f" && printf %s {shlex.quote(setting)} > {config}")
    assert made.returncode == 0, made.stderr
    status, body = hub.api("POST", f"/users/{BOB}/server", PROFILE)
    assert status in (201, 202), body
    hub.wait_ready(BOB)


@pytest.fixture
def users(hub: Hub) -> Iterator[None]:
    ensure_user(BOB)
    hub.api("POST", f"/users/{BOB}")  # 201, or 409 when it exists
    yield
    as_user(BOB, "rm", "-rf", f"/home/{BOB}/.hpcai-test-static", f"/home/{BOB}/.jupyter/jupyter_server_config.py")


def _visit(hub: Hub) -> dict[str, Any]:
    """alice, logged in to the hub, opens bob's page; what its script got."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = logged_in_page(pw, hub, USER)
        try:
            page.wait_for_url("**/hub/**", timeout=60_000)
            page.goto(f"{hub.user_url(BOB)}/static/{PAGE}")
            page.wait_for_function("document.title === 'done'", timeout=60_000)
            return json.loads(page.inner_text("body"))  # type: ignore[no-any-return]
        finally:
            browser.close()


def _as_whom(hub: Hub, token: str) -> str:
    status, body = hub.api("GET", "/user", token=token)
    return str(body.get("name")) if status == 200 else f"HTTP {status}"


def test_a_page_bob_serves_cannot_act_as_alice(hub: Hub, users: None, tmp_path: Path) -> None:
    _serve_page(hub)
    assert hub.user_url(BOB).startswith(f"http://{BOB}.{hub.host}:")  # an origin of bob's own
    try:
        got = _visit(hub)
    finally:
        hub.stop_server(BOB)

    # the control: the same page against a hub that serves every server on its own origin
    single = demo_config_with(tmp_path, "c.JupyterHub.subdomain_host = ''\n"
                                        "c.JupyterHub.cookie_host_prefix_enabled = False")
    control = Hub(tmp_path / "hub", config=single)
    control.start()
    try:
        control.api("POST", f"/users/{USER}")
        control.api("POST", f"/users/{BOB}")
        _serve_page(control)
        assert control.user_url(BOB).startswith(f"{control.url}/user/")  # the hub's own origin
        try:
            stolen = _visit(control)
        finally:
            control.stop_server(BOB)
        assert stolen.get("user") == USER and _as_whom(control, stolen["token"]) == USER, stolen
    finally:
        control.stop(proxy=True)
    attack("bob's page, opened by alice, gets a hub token as her (one origin per user)",
           "token" not in got and all(not t.get("user") for t in got["tried"]),
           f"what its script got: {json.dumps(got)[:240]}; control, every server on the hub's origin: the page "
           f"got a token that answers the hub's API as {USER}")


def _plain(url: str, method: str = "GET") -> tuple[int, str]:
    """``method`` ``url`` without following a redirect: the status and where it points."""
    import http.client
    from urllib.parse import urlsplit

    from jupyter_hpcai.demo import loopback

    target, host = loopback(url)
    parts = urlsplit(target)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request(method, parts.path, headers=host)
    reply = conn.getresponse()
    return reply.status, reply.getheader("Location") or ""


def test_the_hubs_pages_answer_on_the_hubs_origin_only(hub: Hub) -> None:
    """The proxy sends every name to the hub (it must, for a user's server that is not running): the hub's login
    page on bob's origin would set a logged-in visitor's cookie where bob's server receives it, and run beside his
    script (which could read the password typed). The hub sends such a request to its own origin (GET) or refuses
    it; the control: the same page on the hub's origin is the page."""
    bobs = f"http://{BOB}.{hub.host}:{hub.port}"
    status, where = _plain(f"{bobs}/hub/login")
    posted, _ = _plain(f"{bobs}/hub/login", "POST")
    control, _ = _plain(f"{hub.url}/hub/login")
    assert control == 200
    attack("the hub's login page served on bob's origin (a visitor's login cookie set where bob's server reads it)",
           status == 302 and where == f"{hub.url}/hub/login" and posted == 403,
           f"GET {status} to {where}; POST {posted}; control, on the hub's origin: {control}")
