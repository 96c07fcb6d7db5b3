"""Tocsin: fire each task at its timestamp, to the millisecond, exactly once."""

from typing import Any


def __getattr__(name: str) -> Any:
    # `from tocsin import Client` without making every Lambda import the client.
    if name == "Client":
        from tocsin.client import Client

        return Client
    raise AttributeError(name)
