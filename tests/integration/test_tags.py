"""Tags on tasks and schedules (tocsin.tags): kept and shown, a schedule's on each of its
occurrences, and the owner's listing filtered by all the tags it names, page by page."""

from tests.conftest import call_api, webhook_task
from tests.integration.test_schedules import every_two_seconds, occurrences
from tocsin import clock


def tagged(task_id: str, due_in_s: int, **tags: str) -> dict:
    body = webhook_task("https://example.com/h", clock.now_ms() + due_in_s * 1000, task_id)
    return body | {"tags": tags}


def listed(runtime, query: str, principal: str = "alice") -> list[str]:
    """Every task id the listing gives for `query`, following its pages."""
    ids, next_page = [], None
    while True:
        more = f"&next={next_page}" if next_page else ""
        status, page = call_api(runtime, "GET", f"/tasks?limit=2&{query}{more}", None, principal)
        assert status == 200, page
        ids += [task["id"] for task in page["tasks"]]
        if not (next_page := page["next"]):
            return ids


def test_the_listing_gives_the_tasks_carrying_every_tag_it_names(runtime):
    for task_id, due_in_s, tags in [
        ("a", 100, {"user": "42", "kind": "reminder"}),
        ("b", 200, {"user": "42"}),
        ("c", 300, {"user": "7", "kind": "reminder"}),
        ("d", 400, {"user": "42", "kind": "reminder"}),
        ("e", 500, {}),
    ]:
        assert call_api(runtime, "POST", "/tasks", tagged(task_id, due_in_s, **tags))[0] == 201
    assert call_api(runtime, "GET", "/tasks/a")[1]["tags"] == {"user": "42", "kind": "reminder"}
    assert listed(runtime, "tag[user]=42") == ["a", "b", "d"]
    assert listed(runtime, "tag[user]=42&tag[kind]=reminder") == ["a", "d"]
    assert listed(runtime, "tag[kind]=reminder&status=PENDING") == ["a", "c", "d"]
    assert listed(runtime, "tag[user]=42", principal="bob") == []  # alice's tags are hers


def test_a_schedules_tags_are_on_each_of_its_occurrences(runtime, receiver):
    body = every_two_seconds(receiver.url, clock.now_ms() + 20_000, tags={"user": "42"})
    status, schedule = call_api(runtime, "POST", "/schedules", body)
    assert status == 201 and schedule["tags"] == {"user": "42"}
    made = occurrences(runtime, "tick")
    assert made and all(task["tags"] == {"user": "42"} for task in made)
    assert listed(runtime, "tag[user]=42") == [task["id"] for task in made]


def test_bad_tags_are_refused_naming_the_field(runtime):
    for tags, field in [
        ({"has space": "x"}, "tags"),
        ({"user": "x" * 129}, "tags.user"),
        ({f"k{i}": "v" for i in range(11)}, "tags"),
    ]:
        status, error = call_api(runtime, "POST", "/tasks", tagged("t", 100) | {"tags": tags})
        assert status == 400 and error["error"]["field"].startswith(field), (tags, error)
    status, error = call_api(runtime, "GET", "/tasks?tag[user]=" + "x" * 129)
    assert status == 400 and error["error"]["field"] == "tag[user]"
    assert call_api(runtime, "GET", "/tasks")[1]["tasks"] == []  # nothing was written
