"""Webhooks reach public addresses only, checked on the address that is connected to, and
carry signatures that a standard library verifies."""

import base64
import socket
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tocsin.errors import PermanentTargetError
from tocsin.targets import address_guard
from tocsin.targets.webhook import signature_headers, signing_keys


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
        # IPv6 forms that carry an IPv4 address, judged by the address inside
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:5",  # NAT64 of 10.0.0.5
        "::127.0.0.1",  # IPv4-compatible
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
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


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "2606:2800:220:1:248:1893:25c8:1946",
        "64:ff9b::5db8:d822",
        "2002:5db8:d822::1",
    ],
)
def test_public_addresses_are_allowed_in_every_form(address, monkeypatch):
    """NAT64 and 6to4 of a public IPv4 address are public: IPv6-only networks reach it so."""
    answer = [(socket.AF_INET6 if ":" in address else socket.AF_INET, 1, 6, "", (address, 443))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    assert address_guard.resolve("hooks.example.com", 443, allow_internal=False) == address


def test_a_name_with_any_internal_answer_is_refused(monkeypatch):
    """DNS that answers public and private at once cannot steer the connection inside."""
    answer = [
        (socket.AF_INET, 1, 6, "", ("93.184.216.34", 443)),
        (socket.AF_INET, 1, 6, "", ("10.0.0.5", 443)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    with pytest.raises(PermanentTargetError):
        address_guard.resolve("rebind.example.com", 443, allow_internal=False)


def test_signatures_verify_with_the_standard_webhooks_library():
    """The receiver's side is the `standardwebhooks` package, not our code."""
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body, now_s = b'{"a":1}', int(time.time())
    headers = signature_headers(signing_keys(secret), "t-1:2", now_s, body)
    assert Webhook(secret).verify(body, headers) == {"a": 1}
    assert headers["webhook-id"] == "t-1:2"

    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(secret).verify(b'{"a":2}', headers)  # tampered body
    other = "whsec_" + base64.b64encode(b"o" * 32).decode()
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(other).verify(body, headers)  # wrong secret
    stale = signature_headers(signing_keys(secret), "t-1:2", now_s - 600, body)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(body, stale)  # replayed ten minutes later


def test_while_rotating_both_keys_sign_and_either_verifies():
    old, new = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
    body = b'{"a":1}'
    headers = signature_headers(signing_keys(f"whsec_{new} {old}"), "t-1:1", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(old).verify(body, headers) == Webhook(f"whsec_{new}").verify(body, headers)


def test_a_secret_that_is_not_base64_fails_clearly():
    with pytest.raises(PermanentTargetError, match="whsec_<base64>"):
        signing_keys("whsec_not base64!")
