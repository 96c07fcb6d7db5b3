"""Bad input is refused with an error naming the field; nothing is written."""

import pytest

from tocsin.errors import InvalidTask
from tocsin.settings import MAX_FLOW_PARALLELISM, MAX_FLOW_RATE, MAX_PAYLOAD_BYTES, Settings
from tocsin.submit import new_item

NOW = 1_800_000_000_000
CONFIG = Settings(WEBHOOK_ALLOWED_HOSTS="")


def body(**changes):
    base = {
        "id": "task-1",
        "due_at": "2027-01-15T08:00:00.250Z",
        "type": "webhook",
        "target": {"url": "https://hooks.example.com/x"},
        "payload": {"a": 1},
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": "has space"}, "id"),
        ({"id": "x" * 65}, "id"),
        ({"due_at": "2027-01-15T10:00:00"}, "due_at"),
        ({"due_at": "tomorrow"}, "due_at"),
        ({"due_at": "2031-01-01T00:00:00Z"}, "due_at"),
        ({"due_at": 12345}, "due_at"),  # not epoch seconds in 1970
        ({"due_at": 1_800_000_000.25}, "due_at"),
        ({"due_at": "2026-01-15T08:00:00.250Z"}, "due_at"),  # a year early: a typo
        ({"type": "carrier-pigeon"}, "type"),
        ({"extra": 1}, "extra"),
        ({"target": {"url": "ftp://example.com/x"}}, "target.url"),
        ({"target": {"url": "http://example.com/x"}}, "target.url"),
        ({"target": {"url": "https://10.0.0.8/x"}}, "target.url"),
        ({"target": {"url": "https://169.254.169.254/latest"}}, "target.url"),
        ({"target": {"url": "https://localhost/x"}}, "target.url"),
        ({"target": {"url": "https://[::127.0.0.1]/x"}}, "target.url"),
        ({"target": {"url": "https://[2002:7f00:1::]/x"}}, "target.url"),
        ({"target": {"url": "https://[64:ff9b::a9fe:a9fe]/latest"}}, "target.url"),
        ({"target": {"url": "https://a.example", "headers": {"Host": "x"}}}, "target.headers"),
        (
            {"type": "lambda", "target": {"function_arn": "arn:aws:lambda:nope"}},
            "target.function_arn",
        ),
        ({"type": "sqs", "target": {"queue_url": "https://evil.example/q"}}, "target.queue_url"),
        ({"type": "sns", "target": {}}, "target.topic_arn"),
        ({"type": "email", "target": {"source": "a@b.co", "to": [], "subject": "s"}}, "target.to"),
        ({"payload": "x" * (MAX_PAYLOAD_BYTES + 1)}, "payload"),
        ({"flow": {"key": "k", "rate": 0}}, "flow.rate"),
        ({"flow": {"key": "k", "rate": MAX_FLOW_RATE + 1}}, "flow.rate"),
        ({"flow": {"key": "k", "parallelism": 0}}, "flow.parallelism"),
        ({"flow": {"key": "k", "parallelism": MAX_FLOW_PARALLELISM + 1}}, "flow.parallelism"),
        ({"flow": {"key": "k" * 65, "rate": 1}}, "flow.key"),
        ({"flow": {"key": "has space", "rate": 1}}, "flow.key"),
        ({"flow": {"rate": 1}}, "flow.key"),
        ({"flow": {"key": "k"}}, "flow"),  # neither limit
        ({"flow": {"key": "k", "rate": 1, "burst": 3}}, "flow.burst"),
    ],
)
def test_invalid_submission_names_the_field(changes, field):
    with pytest.raises(InvalidTask) as refused:
        new_item(body(**changes), "alice", NOW, CONFIG)
    assert refused.value.field == field
    assert refused.value.status == 400


def test_valid_submission_becomes_a_pending_item_in_the_due_index():
    item = new_item(body(), "alice", NOW, CONFIG)
    assert item["status"] == "PENDING" and item["version"] == 1
    assert item["due_ms"] == item["gsi_due_ms"] == 1_800_000_000_250
    assert item["due_at"] == "2027-01-15T08:00:00.250Z"
    assert 0 <= int(item["gsi_pk"]) < CONFIG.shards


def test_same_instant_in_another_zone_is_the_same_body():
    utc = new_item(body(), "alice", NOW, CONFIG)
    paris = new_item(body(due_at="2027-01-15T09:00:00.250+01:00"), "alice", NOW, CONFIG)
    assert utc["body_hash"] == paris["body_hash"]


def test_generated_ids_are_unique_and_valid():
    first = new_item(body(id=None), "alice", NOW, CONFIG)["task_id"]
    second = new_item(body(id=None), "alice", NOW, CONFIG)["task_id"]
    assert first != second and len(first) == 32


def test_a_due_at_slightly_past_fires_at_once_one_long_past_is_refused():
    config = Settings(MAX_OVERDUE_SECONDS=300)
    recent = new_item(body(due_at="2027-01-15T07:55:00.250Z"), "alice", NOW, config)
    assert recent["due_ms"] == NOW - 299_750  # kept: it fires at once, marked late
    with pytest.raises(InvalidTask, match="more than 300 seconds in the past") as refused:
        new_item(body(due_at="2027-01-15T07:54:59.250Z"), "alice", NOW, config)
    assert refused.value.field == "due_at"


def test_a_delay_from_a_late_event_still_fires():
    """An EventBridge event delivered a day late with `delay` P1D is due now, not refused."""
    item = new_item(
        body(due_at=None, delay="PT1H"), "events", NOW, CONFIG, base_ms=NOW - 86_400_000
    )
    assert item["due_ms"] == NOW - 86_400_000 + 3_600_000


def test_a_flow_is_stored_and_hashed_only_when_named():
    plain = new_item(body(), "alice", NOW, CONFIG)
    flowing = new_item(body(flow={"key": "api.example.com", "rate": 50}), "alice", NOW, CONFIG)
    assert "flow" not in plain
    assert flowing["flow"] == '{"key":"api.example.com","rate":50}'
    assert flowing["body_hash"] != plain["body_hash"]
    assert plain["body_hash"] == new_item(body(), "alice", NOW + 1000, CONFIG)["body_hash"]
