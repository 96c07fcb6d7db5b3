"""The console in a real Chromium (Debian's, driven by Playwright), against `tocsin serve`'s
server over the embedded runtime, and `tocsin console`'s against a stand-in for a deployed
API that checks each call's SigV4 signature as API Gateway's IAM authorizer would.

Set TOCSIN_CONSOLE_SHOTS to a folder (docs/ for the README's) to keep each view's screenshot.
"""

import os
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from playwright.sync_api import expect

from tests.conftest import (
    all_tasks,
    call_api,
    http_server,
    polling,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import clock
from tocsin.client import Client
from tocsin.console.guard import COOKIE
from tocsin.console.remote import signed_upstream
from tocsin.console.server import serving_console
from tocsin.local.server import api_event, serving
from tocsin.measure.console_load import FLAGS as CHROMIUM_FLAGS
from tocsin.measure.console_load import chromium
from tocsin.settings import settings

CHROMIUM = chromium()
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium: `apt-get install -y chromium` (Debian, Ubuntu), or TOCSIN_CHROMIUM",
    ),
    pytest.mark.any_python,  # the browser sees the same page whichever Python serves it
]
FLAGS = [*CHROMIUM_FLAGS, "--host-resolver-rules=MAP rebound.test 127.0.0.1"]  # a rebinding
SHOTS = os.environ.get("TOCSIN_CONSOLE_SHOTS")
# The page reloads its view every 2 s (POLL_MS), through a server that shares its process
# with the runtime: on a loaded machine Playwright's 5 s for a change to show left little
# more than one reload.
expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page that fails the test on a script error or a refused resource (the CSP)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    # a refused request is logged as a failed load: a test looks at what the page showed
    page.on(
        "console",
        lambda m: (
            m.type == "error"
            and not m.text.startswith("Failed to load resource")
            and problems.append(m.text)
        ),
    )
    yield page
    context.close()
    assert problems == []


@pytest.fixture
def console(runtime: Any) -> Iterator[str]:
    with serving(runtime, principal="alice") as url:
        yield url


def shot(page: Any, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"console-{name}.png"))


def rows(page: Any) -> list[str]:
    return page.locator("#view tbody tr td:first-child").all_inner_texts()


def test_tasks_appear_in_upcoming_in_due_order_then_fire_into_recent_with_lateness(
    console, page, runtime, receiver
):
    now = clock.now_ms()
    for task_id, due_in_s in (("third", 240), ("first", 10), ("second", 120)):
        body = webhook_task(f"{receiver.url}/{task_id}", now + due_in_s * 1000, task_id)
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, now + 60_000, "bobs"), "bob")

    page.goto(console)
    expect(page.locator("#view tbody tr")).to_have_count(3)
    assert rows(page) == ["first", "second", "third"]  # bob's task is not alice's to see
    assert page.locator("svg circle").count() == 3 and "acting as alice" in page.inner_text(
        "#session"
    )
    shot(page, "upcoming")

    wait_for_status("first", {"SUCCEEDED"})
    expect(page.locator("#view tbody tr")).to_have_count(2)  # it left Upcoming
    page.click("nav >> text=Recent")
    row = page.locator("#view tbody tr", has_text="first")
    row.wait_for()
    lateness = int(stored("first")["lateness_ms"])
    assert f"{lateness} ms" in row.inner_text() and "SUCCEEDED" in row.inner_text()
    assert page.inner_text("#early").startswith("early: 0")
    shot(page, "recent")


def open_later_task(console: str, page: Any, runtime: Any, task_id: str) -> None:
    """A task due in ten minutes, submitted through the API, open on its page."""
    body = webhook_task("https://example.com/h", clock.now_ms() + 600_000, task_id)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    page.goto(f"{console}/#/task/{task_id}")
    page.locator("#status", has_text="PENDING").wait_for()


def test_a_tasks_page_shows_each_attempt_and_the_execution_that_claimed_it(
    console, page, runtime, receiver
):
    receiver.script_for["/flaky"] = [503]  # then 200
    body = webhook_task(f"{receiver.url}/flaky", clock.now_ms() + 1500, "flaky")
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    wait_for_status("flaky", {"SUCCEEDED"})
    page.goto(f"{console}/#/task/flaky")
    attempts = page.locator("#view tr.attempt")
    expect(attempts).to_have_count(2)
    first, second = attempts.all_inner_texts()
    assert first.startswith("1") and "failed" in first and "503" in first
    lateness = int(stored("flaky")["lateness_ms"])
    assert second.startswith("2") and f"sent, {lateness} ms late" in second
    assert "flaky-v1" in page.inner_text("#view dl")
    shot(page, "task")


def test_a_tasks_page_shows_whom_it_tells_and_links_the_callback_both_ways(
    console, page, runtime, receiver
):
    told = {"type": "webhook", "target": {"url": receiver.url, "headers": {"x-key": "hush"}}}
    body = webhook_task(receiver.url, clock.now_ms() + 1500, "telling") | {"on_success": told}
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    wait_for_status("telling.1.callback", {"SUCCEEDED"})
    page.goto(f"{console}/#/task/telling")
    told_to = page.locator("#view pre.on_success")
    expect(told_to).to_contain_text(receiver.url)
    assert "hush" not in told_to.inner_text() and "•••" in told_to.inner_text()
    page.get_by_role("link", name="telling.1.callback").click()
    page.locator("#status", has_text="SUCCEEDED").wait_for()
    page.get_by_role("link", name="telling", exact=True).click()
    expect(page.locator("#view pre.on_success")).to_be_visible()


def test_a_retrying_tasks_page_shows_its_next_attempt_and_the_errors_so_far(
    console, page, runtime, receiver
):
    receiver.status_for["/down"] = 503
    body = webhook_task(f"{receiver.url}/down", clock.now_ms() + 1500, "down")
    body["retry"] = {"min_backoff_s": 600}
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    waiting = wait_for_status("down", {"RETRYING"})
    page.goto(f"{console}/#/task/down")
    page.locator("#status", has_text="RETRYING").wait_for()
    expect(page.locator("#next-attempt")).to_have_text(waiting["next_attempt_at"].replace("T", " "))
    [attempt] = page.locator("#view tr.attempt").all_inner_texts()
    assert attempt.startswith("1") and "503" in attempt
    life = page.get_by_role("img", name="the task's life")
    expect(life).to_contain_text("next attempt")
    page.click("button[name=cancel]")
    page.locator("#status", has_text="CANCELLED").wait_for()


HELD_LONG_ENOUGH_MS = 2500  # for its page to load and show the hold on a busy machine


def held_for_ms(task: dict) -> int:
    """How much longer the task's flow holds it (0 if it does not, or no longer)."""
    if "planned_ms" not in task or "fired_at" in task:
        return 0
    return int(task["planned_ms"]) - clock.now_ms()


def test_a_tasks_page_shows_its_flow_when_it_holds_the_task_and_for_how_long(
    console, page, runtime, receiver
):
    """Five tasks due together at a flow of 1 a second: the page of one held for seconds
    more says until when its flow holds it, in its facts and on its life's axis, then how
    long it held it."""
    due = clock.now_ms() + 2500
    for task_id in ("first", "second", "third", "fourth", "fifth"):
        body = webhook_task(receiver.url, due, task_id) | {"flow": {"key": "one-host", "rate": 1}}
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    deadline = time.monotonic() + 10
    while not (held := [t for t in all_tasks() if held_for_ms(t) >= HELD_LONG_ENOUGH_MS]):
        assert time.monotonic() < deadline, "no task held long enough by its flow"
        time.sleep(0.05)
    last = max(held, key=lambda task: int(task["planned_ms"]))
    page.goto(f"{console}/#/task/{last['task_id']}")
    facts = page.locator("#view dl")
    expect(facts).to_contain_text("one-host: 1/s")
    expect(facts).to_contain_text("held until")
    expect(page.locator("#planned")).to_have_text(last["planned_at"].replace("T", " "))
    life = page.get_by_role("img", name="the task's life")
    expect(life).to_contain_text(f"held until {last['planned_at'][11:23]}")
    shot(page, "held")
    page.locator("#status", has_text="SUCCEEDED").wait_for(timeout=15_000)
    held_ms = int(stored(last["task_id"])["held_ms"])
    expect(facts).to_contain_text(f"{held_ms} ms by its flow")
    expect(facts).to_contain_text("planned at")


def test_a_task_cancelled_from_its_page_is_cancelled_through_the_api(console, page, runtime):
    open_later_task(console, page, runtime, "later")
    page.click("button[name=cancel]")
    page.locator("#status", has_text="CANCELLED").wait_for()
    assert call_api(runtime, "GET", "/tasks/later")[1]["status"] == "CANCELLED"


def test_a_refused_reschedule_shows_the_apis_own_error(console, page, runtime):
    open_later_task(console, page, runtime, "moved")
    page.fill("input[name=due]", "2001-01-01T00:00:00Z")
    page.click("button[name=reschedule]")
    error = page.locator("#error")
    error.wait_for()
    _, refused = call_api(runtime, "PATCH", "/tasks/moved", {"due_at": "2001-01-01T00:00:00Z"})
    assert refused["error"]["message"] in error.inner_text() and "400" in error.inner_text()
    assert call_api(runtime, "GET", "/tasks/moved")[1]["version"] == 1  # nothing changed

    page.fill("input[name=due]", "+300s")
    page.click("button[name=reschedule]")
    page.wait_for_selector("#error", state="hidden")
    assert call_api(runtime, "GET", "/tasks/moved")[1]["version"] == 2


def occurrences(runtime: Any, schedule_id: str) -> list[str]:
    """The ids of the tasks a schedule has made."""
    _, page = call_api(runtime, "GET", f"/tasks?schedule={schedule_id}")
    return [task["id"] for task in page["tasks"]]


def test_a_schedule_paused_from_its_page_stops_making_occurrences(console, page, runtime):
    # its first occurrence just beyond the look-ahead: none made at its creation, and within
    # it a few seconds later, when the finder runs: an enabled schedule's would be made then
    lookahead_ms = settings().lookahead_s * 1000
    first_ms = clock.now_ms() + lookahead_ms + 3_000
    spec = {"id": "every", "expression": "rate(1 minute)", "type": "webhook"}
    spec |= {"target": {"url": "https://example.com/h"}, "start_at": clock.to_iso(first_ms)}
    assert call_api(runtime, "POST", "/schedules", spec)[0] == 201
    assert occurrences(runtime, "every") == []
    page.goto(f"{console}/#/schedule/every")
    page.locator("#state", has_text="ENABLED").wait_for()
    expect(page.locator("#view ol li")).to_have_count(10)  # the next ten fire times
    shot(page, "schedule")
    page.click("button[name=toggle]")
    page.locator("#state", has_text="PAUSED").wait_for()
    assert call_api(runtime, "GET", "/schedules/every")[1]["state"] == "PAUSED"
    time.sleep(max(0, first_ms - lookahead_ms + 500 - clock.now_ms()) / 1000)
    finder_ms = clock.now_ms()
    report = runtime.run_finder()
    assert first_ms <= finder_ms + lookahead_ms  # the occurrence was the finder's to make
    assert report["occurrences_made"] == 0 and occurrences(runtime, "every") == []
    page.click("nav >> text=Schedules")
    page.locator("#view tbody tr", has_text="PAUSED").wait_for()
    shot(page, "schedules")
    # resumed, it makes that occurrence at once: what the pause held back was there to make
    assert call_api(runtime, "PATCH", "/schedules/every", {"state": "ENABLED"})[0] == 200
    assert occurrences(runtime, "every") == [f"every.{first_ms}"]
    assert call_api(runtime, "DELETE", "/schedules/every")[0] == 200  # its occurrence cancelled


def test_a_failed_task_is_retried_from_the_failed_view(console, page, runtime, receiver):
    receiver.status_for["/broken"] = 410
    body = webhook_task(f"{receiver.url}/broken", clock.now_ms() + 500, "broken")
    call_api(runtime, "POST", "/tasks", body)
    wait_for_status("broken", {"FAILED"})
    receiver.status_for["/broken"] = 200
    page.goto(f"{console}/#/failed")
    page.locator("#view tbody tr", has_text="broken").wait_for()
    shot(page, "failed")
    page.click("button[data-retry=broken]")
    item = wait_for_status("broken", {"SUCCEEDED"})
    assert int(item["version"]) == 2


def test_the_failed_view_lists_the_hosts_held_back(console, page, runtime, receiver):
    receiver.status_for["/down"] = 503
    due = clock.now_ms() + 1000
    for i in range(5):  # HostHoldFailures: five failed sends in a row hold the host
        body = webhook_task(f"{receiver.url}/down", due, f"down-{i}") | {
            "retry": {"min_backoff_s": 30, "max_backoff_s": 600}
        }
        call_api(runtime, "POST", "/tasks", body)
    deadline = time.monotonic() + 30
    while not call_api(runtime, "GET", "/targets")[1]["held"] and time.monotonic() < deadline:
        time.sleep(0.2)
    page.goto(f"{console}/#/failed")
    host = receiver.url.split("/")[2]
    row = page.locator("#view tbody tr", has_text=host)
    row.wait_for()
    assert "503" in row.inner_text() and "webhook" in row.inner_text()
    shot(page, "held")


def test_a_bulk_cancel_from_the_console_asks_first_then_cancels_them_all(console, page, runtime):
    target = {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"}
    for i in range(7):
        body = {"id": f"user-{i}", "delay": 3600, "type": "sns", "target": target}
        call_api(runtime, "POST", "/tasks", body | {"tags": {"user": "42"}})
    page.goto(f"{console}/#/bulk")
    page.fill("input[name=tags]", "user=42")
    said = page.locator("#bulk-said")
    with polling(runtime):
        page.once("dialog", lambda dialog: dialog.dismiss())
        page.click("button[name=run]")
        expect(said).to_have_text("nothing cancelled")
        assert stored("user-0")["status"] == "PENDING"
        asked = []
        page.once("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
        page.click("button[name=run]")
        expect(said).to_contain_text("done 7")
    assert asked == ["Cancel 7 tasks, and the schedules carrying these tags?"]
    assert {stored(f"user-{i}")["status"] for i in range(7)} == {"CANCELLED"}
    shot(page, "bulk")


def test_a_foreign_host_or_origin_is_refused(console, page):
    port = console.rsplit(":", 1)[1]
    assert page.goto(f"http://rebound.test:{port}/").status == 421  # rebinding: Host refused
    http = urllib3.PoolManager()
    foreign = http.request(
        "POST", f"{console}/tasks", body=b"{}", headers={"Origin": "http://evil.test"}
    )
    assert foreign.status == 403  # a cross-site write never reaches the API
    assert http.request("GET", f"{console}/tasks", headers={"Origin": console}).status == 200


KEYS = {"AKIDALICE": "alice", "AKIDBOB": "bob"}  # access key -> principal, as IAM knows them
SECRET = "not-a-real-secret"


@pytest.fixture
def deployed_api(runtime: Any) -> Iterator[str]:
    """The runtime's API behind a stand-in for API Gateway's IAM auth: a call whose SigV4
    signature does not verify gets 403; a signed one runs as the key's principal."""

    class IamAuthorizer(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            principal = self._verified(body)
            if principal is None:
                self._send(403, b'{"message":"Forbidden"}')
                return
            text = body.decode() if body else None
            event = api_event(self.command, self.path, text, principal, dict(self.headers.items()))
            reply = runtime.invoke("ApiFunction", event)
            self._send(int(reply["statusCode"]), (reply.get("body") or "").encode())

        def _verified(self, body: bytes | None) -> str | None:
            """The principal of the key that signed the request, if its signature is the
            one the key's secret gives for the request as received (None: refused)."""
            given = self.headers.get("Authorization", "")
            key = given.partition("Credential=")[2].partition("/")[0]
            names = given.partition("SignedHeaders=")[2].partition(",")[0].split(";")
            if key not in KEYS or "host" not in names:
                return None
            headers = {n: v for n, v in self.headers.items() if n.lower() in names}
            url = f"http://{self.headers['Host']}{self.path}"
            received = AWSRequest(method=self.command, url=url, data=body, headers=headers)
            received.context["timestamp"] = self.headers.get("X-Amz-Date", "")
            signer = SigV4Auth(Credentials(key, SECRET), "execute-api", "us-east-1")
            text = signer.string_to_sign(received, signer.canonical_request(received))
            expected = signer.signature(text, received)
            return KEYS[key] if given.endswith(f"Signature={expected}") else None

        def _send(self, status: int, raw: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_PATCH = do_DELETE = _handle

        def log_message(self, *args: Any) -> None:
            pass

    with http_server(IamAuthorizer) as url:
        yield url


def test_the_console_against_a_stack_signs_each_call_and_asks_for_its_token(
    deployed_api, runtime, page, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDALICE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    due = clock.now_ms() + 600_000
    call_api(runtime, "POST", "/tasks", webhook_task("https://example.com/h", due, "alices"))
    call_api(runtime, "POST", "/tasks", webhook_task("https://example.com/h", due, "bobs"), "bob")
    unsigned = urllib3.PoolManager().request("GET", f"{deployed_api}/tasks")
    assert unsigned.status == 403  # the stand-in refuses what is not signed

    upstream = signed_upstream(deployed_api, region="us-east-1")
    session = {"principal": "alice (AKIDALICE)", "api": deployed_api}
    with serving_console(upstream, session, token="the-token") as url:
        base = url.partition("/?")[0]
        assert page.goto(base).status == 401  # without its token
        page.goto(url)
        assert page.url == f"{base}/"  # the token left the address bar for a cookie
        cookie = {c["name"]: c for c in page.context.cookies()}[COOKIE]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        page.goto(f"{base}/#/task/alices")
        page.locator("#status", has_text="PENDING").wait_for()
        page.click("button[name=cancel]")
        page.locator("#status", has_text="CANCELLED").wait_for()
        page.goto(f"{base}/#/upcoming?window=3600")
        page.locator("#upcoming-summary", has_text="0 tasks").wait_for()
        assert "alices" not in page.inner_text("#view") and "bobs" not in page.inner_text("#view")
    assert stored("alices")["status"] == "CANCELLED" and stored("bobs")["status"] == "PENDING"
    # the page's client, as a program would use it, sees the same through the stand-in
    assert [t.id for t in Client(deployed_api, region="us-east-1").list().tasks] == ["alices"]
