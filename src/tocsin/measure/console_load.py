"""`tocsin bench --scenarios console`: how long each console view takes to show, in a real
Chromium, with 10,000 tasks in the store (half fired in the last hour, half due in the next
six, a tenth of those failed), from the address typed to its table drawn.

Every view reads pages of at most 100 tasks and at most 200 tasks in all (Failed: 25 at a
time), within a time window, not the whole store, so its time depends on what it shows,
not on the store's size.
"""

import json
import os
import shutil
import time
from typing import Any

from tocsin import clock
from tocsin.local.server import DEFAULT_PRINCIPAL, serving
from tocsin.measure import placed_long_ago
from tocsin.measure.scenario import Bench, write_items
from tocsin.settings import settings

HOUR_MS = 3_600_000
# Each view, and what shows once it has drawn its data.
VIEWS = {
    "upcoming (1 h)": ("#/upcoming?window=3600", "#view tbody tr"),
    "upcoming (24 h)": ("#/upcoming?window=86400", "#view tbody tr"),
    "recent": ("#/recent", "#view tbody tr"),
    "failed": ("#/failed", "#view tbody tr"),
    "task": ("#/task/console-000000", "#status"),
}
LOADS = 5  # each view's time is the median of this many loads
# Chromium as these machines run it: no sandbox as root, nothing fetched from the network.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    return os.environ.get("TOCSIN_CHROMIUM") or shutil.which("chromium")


def _items(count: int, now: int) -> list[dict[str, Any]]:
    """`count` tasks as the store keeps them: the first half due over the next 6 h, the
    rest fired over the last hour (one in ten of those failed)."""
    from tocsin.submit import new_item

    config, items = settings(), []
    for i in range(count):
        ahead = i < count // 2
        ahead_ms, behind_ms = (i + 1) * 12 * HOUR_MS // count, (i + 1) * HOUR_MS // count
        due = now + ahead_ms if ahead else now - behind_ms
        body = {"id": f"console-{i:06d}", "due_at": clock.to_iso(due), "type": "sns"}
        body["target"] = {"topic_arn": "arn:aws:sns:us-east-1:123456789012:bench"}
        item = placed_long_ago(new_item(body, DEFAULT_PRINCIPAL, due - 60_000, config))
        if not ahead and i % 10:
            late = 1 + i % 7
            item |= {"status": "SUCCEEDED", "attempts": 1, "lateness_ms": late}
            item["fired_at"] = clock.to_iso(due + late)
        elif not ahead:
            item |= {"status": "FAILED", "attempts": 3}
            error = {"Error": "PermanentTargetError", "Cause": "webhook answered 410"}
            item["error"] = json.dumps(error)  # as the executor stores it
        items.append(item)
    return items


def console_load(bench: Bench) -> dict[str, Any]:
    """Each view's load time, median of LOADS, with `bench.size(10_000)` tasks stored."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    if executable is None:
        raise SystemExit("console: no Chromium (apt-get install -y chromium, or TOCSIN_CHROMIUM)")
    tasks = bench.size(10_000)
    with bench.runtime() as runtime:
        write_items(_items(tasks, clock.now_ms()))
        with serving(runtime) as url, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            times = {name: _median_load(page, url, *view) for name, view in VIEWS.items()}
            browser.close()
    return {"tasks_stored": tasks, "load_ms": times, "loads_each": LOADS}


def _median_load(page: Any, url: str, route: str, drawn: str) -> float:
    """The median milliseconds from asking for the view's address to its data drawn."""
    samples = []
    for _ in range(LOADS):
        page.goto("about:blank")
        started = time.perf_counter()
        page.goto(f"{url}/{route}")
        page.locator(drawn).first.wait_for()
        samples.append((time.perf_counter() - started) * 1000)
    return round(sorted(samples)[len(samples) // 2], 1)
