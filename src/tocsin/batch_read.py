"""BatchGetItem as DynamoDB answers it: a call may leave keys unprocessed (it does under
throttling), so those are asked again, with backoff, a few times before giving up."""

import time
from typing import Any

from tocsin.errors import Busy

BATCH_GET_MAX = 100  # keys in one BatchGetItem
UNPROCESSED_TRIES = 5  # calls for one batch of keys, the first included
UNPROCESSED_BACKOFF_S = 0.05  # before the second; doubled before each next


def batch_read(dynamodb: Any, table: str, keys: list[dict[str, Any]], **asked: Any) -> list[Any]:
    """The items of `table` at `keys` (at most BATCH_GET_MAX), read with `asked` (a
    projection, ConsistentRead); Busy if DynamoDB keeps some unprocessed."""
    found: list[Any] = []
    request = {table: {"Keys": keys, **asked}} if keys else {}
    for attempt in range(UNPROCESSED_TRIES):
        if not request:
            return found
        if attempt:
            time.sleep(UNPROCESSED_BACKOFF_S * 2 ** (attempt - 1))
        reply = dynamodb.batch_get_item(RequestItems=request)
        found += reply.get("Responses", {}).get(table, [])
        request = reply.get("UnprocessedKeys") or {}
    raise Busy("the tables are busy: send the same request again")
