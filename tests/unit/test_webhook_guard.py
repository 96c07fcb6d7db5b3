"""Webhooks reach public addresses only, checked on the address that is connected to."""

import socket

import pytest

from tocsin.errors import PermanentTargetError
from tocsin.targets import address_guard
from tocsin.targets.webhook import sign, verify


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "224.0.0.1",
        "0.0.0.0",
        "::1",
        "fd00:ec2::254",
        "fe80::1",
        "::ffff:127.0.0.1",
        "ff02::1",
    ],
)
def test_internal_addresses_are_refused(address, monkeypatch):
    answer = [(socket.AF_INET6 if ":" in address else socket.AF_INET, 1, 6, "", (address, 443))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    with pytest.raises(PermanentTargetError, match="internal address"):
        address_guard.resolve("hooks.example.com", 443, allow_internal=False)


def test_public_address_is_the_one_connected_to(monkeypatch):
    answer = [(socket.AF_INET, 1, 6, "", ("93.184.216.34", 443))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    assert address_guard.resolve("hooks.example.com", 443, allow_internal=False) == "93.184.216.34"


def test_a_name_with_any_internal_answer_is_refused(monkeypatch):
    """DNS that answers public and private at once cannot steer the connection inside."""
    answer = [
        (socket.AF_INET, 1, 6, "", ("93.184.216.34", 443)),
        (socket.AF_INET, 1, 6, "", ("10.0.0.5", 443)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    with pytest.raises(PermanentTargetError):
        address_guard.resolve("rebind.example.com", 443, allow_internal=False)


def test_signature_verifies_only_the_signed_body():
    header = sign("s3cret", 1_800_000_000_000, b'{"a":1}')
    assert verify("s3cret", header, b'{"a":1}')
    assert not verify("s3cret", header, b'{"a":2}')
    assert not verify("other", header, b'{"a":1}')
    assert not verify("s3cret", "garbage", b'{"a":1}')
