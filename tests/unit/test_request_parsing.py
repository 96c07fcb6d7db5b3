"""Parsing what callers type: `--at`, principals, page tokens."""

import argparse

import pytest

from tocsin.cli import when
from tocsin.errors import InvalidTask
from tocsin.lifecycle import decode_page_key, encode_page_key
from tocsin.model import owner_id
from tocsin.store import OWNER_INDEX_KEY, SCHEDULE_INDEX_KEY


@pytest.mark.parametrize(
    ("text", "delay"), [("+90s", 90), ("+1500ms", 1.5), ("+2h", 7200), ("+1d", 86400)]
)
def test_relative_times_become_delays(text, delay):
    assert when(text) == {"delay": delay}


def test_absolute_times_need_a_zone():
    assert when("2027-01-15T08:00:00.250Z")["due_at"].utcoffset().total_seconds() == 0
    for text in ("2027-01-15T08:00:00", "in an hour", "+5 minutes"):
        with pytest.raises(argparse.ArgumentTypeError):
            when(text)


ACCOUNT = "123456789012"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("AROAEXAMPLE:session-1", "AROAEXAMPLE:i-0abc"),  # one role, two sessions
        (
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/session-1",
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/ci",
        ),
    ],
)
def test_a_role_is_one_owner_across_its_sessions(first, second):
    assert owner_id(first) == owner_id(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("AIDAALICE", "AIDABOB"),  # IAM users
        ("AROAEXAMPLE:session-1", "AROAOTHER:session-1"),  # two roles, same session name
        (f"{ACCOUNT}:alice", f"{ACCOUNT}:bob"),  # federated users (GetFederationToken)
        (f"{ACCOUNT}:alice", "210987654321:alice"),  # same name, two accounts
        (f"{ACCOUNT}:alice", ACCOUNT),  # a federated user and its account's root
        (f"arn:aws:iam::{ACCOUNT}:user/alice", f"arn:aws:iam::{ACCOUNT}:user/bob"),
        (
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/s",
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Auditor/s",
        ),
        (
            f"arn:aws:sts::{ACCOUNT}:federated-user/alice",
            f"arn:aws:sts::{ACCOUNT}:federated-user/bob",
        ),
        ("alice", "bob"),
    ],
)
def test_two_principals_are_two_owners(first, second):
    assert owner_id(first) != owner_id(second)


def test_page_tokens_round_trip_for_their_owner_only():
    key = {"task_id": "t-1", "owner": "alice", "due_ms": 1_800_000_000_000}
    token = encode_page_key(key, "alice")
    assert decode_page_key(token, "alice", OWNER_INDEX_KEY) == key
    occurrence = {"task_id": "s.1", "schedule_id": "s", "due_ms": 1}
    by_schedule = encode_page_key(occurrence, "alice")
    assert decode_page_key(by_schedule, "alice", SCHEDULE_INDEX_KEY) == occurrence
    for bad_token, owner, names in (
        (token, "bob", OWNER_INDEX_KEY),
        ("!!", "alice", OWNER_INDEX_KEY),
        (encode_page_key({"a": 1}, "alice"), "alice", OWNER_INDEX_KEY),
        (by_schedule, "bob", SCHEDULE_INDEX_KEY),
        (by_schedule, "alice", OWNER_INDEX_KEY),  # a token of another listing
    ):
        with pytest.raises(InvalidTask) as refused:
            decode_page_key(bad_token, owner, names)
        assert refused.value.field == "next"
