"""The operator UI in a real browser (the system Chromium, headless, driven by Playwright) against
the real fleet: log in, watch the overview update under load, follow a running job's output,
replay a dead letter to success; no page logs a console error. Screenshots of every page go to
.artifacts/ui/ (CI keeps them as test artifacts)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import REPO, RunningFleet
from tests.ui.conftest import ENV, KEY_ADMIN, KEY_TENANT, dead_letter, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / ".artifacts" / "ui"
#: Playwright's own waits (ms): generous, the machine runs the whole fleet besides the browser.
WAIT_MS = 60_000


def _browser_missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e .[dev])"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("ATEFLEET_TESTS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ATEFLEET_TESTS_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


class Page:
    """A logged-in tab that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, fleet: RunningFleet, token: str) -> None:
        self.context = browser.new_context(base_url=fleet.url)
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.dialogs: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.goto("/ui")
        self.page.fill("input[name=token]", token)
        self.page.click("form.login button")
        self.page.wait_for_url("**/ui")

    def _dialog(self, dialog: Any) -> None:
        """Confirmations are accepted; any other dialog (an injected alert) is an error."""
        if dialog.type != "confirm":
            self.errors.append(f"unexpected {dialog.type} dialog: {dialog.message}")
        self.dialogs.append(dialog.message)
        dialog.accept()

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, ui_fleet: RunningFleet) -> Iterator[Page]:
    page = Page(browser, ui_fleet, KEY_ADMIN)
    yield page
    page.close()
    assert page.errors == [], f"console errors: {page.errors}"


def _call(client: httpx.Client, sid: str, command: str) -> str:
    sent = client.post(f"/v1/environments/{ENV}/sessions/{sid}", headers={"Prefer": "respond-async"},
                       json={"type": "function_call", "call_id": "c", "name": "bash", "auto_resume": True,
                             "arguments": {"command": command}})
    assert sent.status_code == 202, sent.text
    return str(sent.json()["id"])


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def test_login_is_required_and_needs_the_admin_scope(browser: Any, ui_fleet: RunningFleet) -> None:
    # given a browser with no cookie: every page leads to the login form
    context = browser.new_context(base_url=ui_fleet.url)
    page = context.new_page()
    page.goto("/ui/dlq")
    assert page.url.endswith("/ui/login")
    page.screenshot(path=str(ARTIFACTS / "login.png"), full_page=True)
    # when a tenant's (non-admin) token is entered, then the UI refuses it
    page.fill("input[name=token]", KEY_TENANT)
    page.click("form.login button")
    expect(page.locator(".error")).to_contain_text("admin scope")
    # and a made-up one is not valid
    page.fill("input[name=token]", "ak_not_a_key")
    page.click("form.login button")
    expect(page.locator(".error")).to_contain_text("not valid")
    context.close()


def test_the_login_cookie_is_http_only_strict_and_scoped_to_the_ui(ui_fleet: RunningFleet) -> None:
    with httpx.Client(base_url=ui_fleet.url) as client:
        answer = client.post("/ui/login", data={"token": KEY_ADMIN})
        refused = client.post("/ui/login", data={"token": KEY_TENANT})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert refused.status_code == 403 and "set-cookie" not in refused.headers


def test_actions_need_the_csrf_token(ui_fleet: RunningFleet) -> None:
    with httpx.Client(base_url=ui_fleet.url, cookies={"atefleet_ui": KEY_ADMIN}) as client:
        for path in ["/ui/dlq/1-0/replay", f"/ui/sessions/{ENV}/x/destroy", "/ui/logout"]:
            forged = client.post(path, data={"confirm": "yes", "csrf": "0" * 64})
            assert forged.status_code == 403, path
            assert client.post(path, data={"confirm": "yes"}).status_code == 403, path
        cross = client.post("/ui/logout", headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403


def test_the_overview_updates_while_a_load_runs(tab: Page, ui_fleet: RunningFleet) -> None:
    # given the overview open and live, showing the calls/s of the last minute
    panel = tab.page.locator("#overview")
    tab.page.wait_for_function("document.querySelector('#overview').dataset.updates >= 1")
    calls = "Number(document.querySelector('[data-k=calls]').textContent)"
    before = float(tab.page.evaluate(calls))
    updates = int(tab.page.evaluate("document.querySelector('#overview').dataset.updates"))
    stop = threading.Event()

    def load() -> None:
        with ui_fleet.client(KEY_ADMIN) as client:
            while not stop.is_set():
                for i in range(4):
                    client.post(f"/v1/environments/{ENV}/sessions/load-{i}",
                                json={"type": "function_call", "call_id": "c", "name": "bash",
                                      "auto_resume": True, "arguments": {"command": "echo hi"}})

    # when calls run, then the live panel shows them without a reload
    worker = threading.Thread(target=load)
    worker.start()
    try:
        tab.page.wait_for_function(f"{calls} > {before}", timeout=WAIT_MS)
    finally:
        stop.set()
        worker.join()
    assert "p50 latency" in panel.inner_text() and "/s now" in panel.inner_text()
    assert int(tab.page.evaluate("document.querySelector('#overview').dataset.updates")) > updates
    tab.shot("overview")


def test_a_session_and_its_running_job_show_output_as_it_arrives(tab: Page, ui_fleet: RunningFleet) -> None:
    # given a job printing a line a second, running
    with ui_fleet.client(KEY_ADMIN) as client:
        job_id = _call(client, "ui-live", "echo '<img src=x onerror=alert(1)>'; "
                                          "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 1; done")
        wait_for("the job to run", lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "running")

    # when its session's page is opened and the running job followed from there
    tab.page.goto(f"/ui/sessions/{ENV}/ui-live")
    tab.shot("session")
    tab.page.click(f"a[href='/ui/jobs/{job_id}']")
    tab.page.wait_for_url(f"**/ui/jobs/{job_id}")

    # then output arrives on the open page while the job still runs, then the result
    expect(tab.page.locator("#output")).to_contain_text("line3", timeout=WAIT_MS)
    assert tab.page.locator("#job-state").inner_text() == "running"
    tab.shot("job-running")
    expect(tab.page.locator("#job-state")).to_have_text("succeeded", timeout=WAIT_MS)
    expect(tab.page.locator("#output")).to_contain_text("line8")
    expect(tab.page.locator("#output")).to_contain_text("<img src=x onerror=alert(1)>")  # text, not markup
    tab.shot("job")

    # and the session's Suspend button (confirmed) enqueues an audited suspend that succeeds
    tab.page.goto(f"/ui/sessions/{ENV}/ui-live")
    tab.page.locator("form[action$='/suspend'] button").click()
    expect(tab.page.locator("#job-state")).to_have_text("succeeded", timeout=WAIT_MS)
    assert tab.dialogs[-1] == f"Suspend session {ENV}/ui-live?"
    with ui_fleet.client(KEY_ADMIN) as client:
        records = client.get("/v1/audit", params={"session": "ui-live"}).json()["records"]
    assert any(r.get("op") == "ui_suspend" and r.get("pr") == "key:admin" for r in records)
    # and the session's page then shows the snapshot's size
    tab.page.goto(f"/ui/sessions/{ENV}/ui-live")
    size = re.compile(r"\d+(\.\d+)? (Bytes|kB|MB)")
    expect(tab.page.locator("dd", has_text="last one")).to_contain_text(size)


def test_a_dead_letter_is_replayed_from_the_ui_and_succeeds(tab: Page, ui_fleet: RunningFleet) -> None:
    # given a dead-lettered call
    with ui_fleet.client(KEY_ADMIN) as client:
        failed = dead_letter(client, ui_fleet, "ui-dlq", "echo back-from-the-dead")

    # when the operator replays it from the DLQ page (confirming the dialog)
    tab.page.goto("/ui/dlq")
    row = tab.page.locator("tr", has=tab.page.locator(f"a[href='/ui/jobs/{failed['id']}']"))
    tab.shot("dlq")
    row.locator("button", has_text="Replay").click()

    # then its job page shows it run again and succeed
    tab.page.wait_for_url(f"**/ui/jobs/{failed['id']}")
    expect(tab.page.locator("#job-state")).to_have_text("succeeded", timeout=WAIT_MS)
    expect(tab.page.locator("#output")).to_contain_text("back-from-the-dead")


def test_lists_and_searches_render(tab: Page) -> None:
    for name, path in [("sessions", f"/ui/sessions?env={ENV}"),
                       ("sessions-running", "/ui/sessions?state=running"),
                       ("jobs", "/ui/jobs"), ("jobs-succeeded", "/ui/jobs?state=succeeded"),
                       ("jobs-of-session", f"/ui/jobs?session={ENV}/ui-live")]:
        answer = tab.page.goto(path)
        assert answer is not None and answer.status == 200, path
        tab.shot(name)
    assert tab.page.locator("table.jobs tbody tr").count() >= 1
