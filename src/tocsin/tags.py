"""Tags: up to ten key/value pairs on a task or a schedule (a schedule's occurrences carry
its), by which the owner's listing is filtered, as AWS's tags allow their characters
(without spaces). A task without tags stores nothing more."""

from typing import Annotated, Any

from pydantic import Field, StringConstraints

TAG_PATTERN = r"^[A-Za-z0-9_.:/=+\-@]{1,128}$"
MAX_TAGS = 10
# `tag[<key>]=<value>` in a query string (OpenAPI's deepObject): `[` and `]` are in no key.
QUERY_PREFIX, QUERY_SUFFIX = "tag[", "]"

TagText = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
Tags = Annotated[dict[TagText, TagText], Field(max_length=MAX_TAGS)]


def wanted_tags(query: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A listing's query split into the tags it asks for (`tag[key]=value`) and the rest."""
    tags, rest = {}, {}
    for name, value in query.items():
        if name.startswith(QUERY_PREFIX) and name.endswith(QUERY_SUFFIX):
            tags[name[len(QUERY_PREFIX) : -len(QUERY_SUFFIX)]] = value
        else:
            rest[name] = value
    return tags, rest


def has_tags(item: dict[str, Any], wanted: dict[str, str]) -> bool:
    """Whether a task carries every tag asked for."""
    kept = item.get("tags") or {}
    return all(kept.get(key) == value for key, value in wanted.items())
