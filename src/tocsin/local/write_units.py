"""The write request units DynamoDB bills a write, its global indexes' included.

On demand, a write is billed one unit per 1 KB of the item: the larger of its image before
and after, twice that inside a transaction (its index writes too: DynamoDB Local bills them
so, and a test replays Tocsin's writes there), and at least one unit even when its
condition refuses it. Each global secondary index the
write touches is billed too (DynamoDB's developer guide, "Global secondary indexes",
writes): an entry put or removed is one unit per 1 KB of the entry, an entry whose index
key changed is two writes (the old one deleted, the new one put), an entry whose projected
attributes changed is one, and an index the write leaves as it was costs nothing. Counting
requests instead misses every index write: a task enters its owner's index at the put and
moves between the dispatch index's shards as its state changes.

The embedded runtime's DynamoDB process counts these with moto's attribute sizes, from
images taken around each write it serves (`Metering`).
"""

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tocsin.flow_keys import LEASE_PART, part_of

KB = 1024
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
# What a write refused by its condition answers: billed all the same.
CONDITION_REFUSALS = ("ConditionalCheckFailedException", "TransactionCanceledException")


@dataclass(frozen=True)
class Entry:
    """An item's entry in one global index."""

    key: tuple[str, ...]  # the index key's values
    attributes: dict[str, tuple[str, str]]  # what the index projects: type and value
    size: int


@dataclass(frozen=True)
class Image:
    """What a write's bill depends on in one item: its size and its entry in each global
    index (None where the item is in no index: it lacks the index key)."""

    size: int
    entries: dict[str, Entry | None]


def units(size: int) -> int:
    return max(1, math.ceil(size / KB))


def write_units(before: Image, after: Image, transactional: bool = False) -> Counter[str]:
    """`table` and `index` units for one item written from `before` to `after`, and each
    index's own as `index:<name>`."""
    twice = 2 if transactional else 1
    billed: Counter[str] = Counter(table=units(max(before.size, after.size)) * twice)
    for name, old in before.entries.items():
        new = after.entries[name]
        if old == new:  # in no index before or after, or the same entry
            continue
        if old is None or new is None:  # put, or removed
            here = units((old or new).size)  # type: ignore[union-attr]
        elif old.key != new.key:  # the index key changed: the old one deleted, the new put
            here = units(old.size) + units(new.size)
        else:  # projected attributes changed
            here = units(new.size)
        billed["index"] += here * twice
        billed[f"index:{name}"] += here * twice
    return billed


def image(table: Any, item: Any) -> Image:
    """The image of a moto `Item` (None: no item) in a moto `Table`."""
    if item is None:
        return Image(0, dict.fromkeys((i.name for i in table.global_indexes), None))
    entries: dict[str, Entry | None] = {}
    for index in table.global_indexes:
        keys = [item.attrs.get(name) for name in index.schema_key_attrs]
        if any(key is None for key in keys):
            entries[index.name] = None
            continue
        names = _projected(index, item)
        attributes = {name: (item.attrs[name].type, repr(item.attrs[name].value)) for name in names}
        size = sum(len(name.encode()) + item.attrs[name].size() for name in names)
        entries[index.name] = Entry(tuple(repr(key.value) for key in keys), attributes, size)
    return Image(item.size(), entries)


def _projected(index: Any, item: Any) -> list[str]:
    """The attributes of `item` that `index` holds (moto's `SecondaryIndex.project`)."""
    projection = index.projection.get("ProjectionType", "ALL")
    if projection == "ALL":
        return list(item.attrs)
    names = [*index.table_key_attrs, *index.schema_key_attrs]
    if projection == "INCLUDE":
        names += index.projection.get("NonKeyAttributes", [])
    return [name for name in dict.fromkeys(names) if name in item.attrs]


def written_keys(action: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(table, key or whole item, transactional) for each item a write request writes."""
    if action in ("PutItem", "UpdateItem", "DeleteItem"):
        return [(body["TableName"], _key(body), False)]
    if action == "BatchWriteItem":
        return [
            (table, _key(next(iter(request.values()))), False)
            for table, requests in body.get("RequestItems", {}).items()
            for request in requests
        ]
    if action == "TransactWriteItems":
        return [
            (written["TableName"], _key(written), True)
            for entry in body.get("TransactItems", [])
            for written in entry.values()
        ]
    return []


def _flow_part(key: dict[str, Any]) -> str | None:
    """`flow:leases` or `flow:ledger` for an item of a flow's (`tocsin.flow`), whose units,
    of the table's, are shown apart too: what flow control writes a send."""
    if (part := part_of(key)) is None:
        return None
    return "flow:leases" if part.startswith(LEASE_PART) else "flow:ledger"


def _key(written: dict[str, Any]) -> dict[str, Any]:
    """A write's key, or the whole item it puts (its key attributes among the rest)."""
    return written.get("Key") or written.get("Item", {})


class Metering:
    """Write units of the requests one moto DynamoDB backend serves, request by request."""

    def __init__(self, backend: Any):
        self._backend = backend
        self.billed: Counter[str] = Counter()

    def before(self, action: str, body: dict[str, Any]) -> list[tuple[Any, Any, Image, bool]]:
        """The images of what the request is about to write."""
        taken = []
        for table_name, key, transactional in written_keys(action, body):
            try:
                table = self._backend.get_table(table_name)
            except Exception:  # no such table: moto refuses the request itself
                continue
            taken.append((table, key, image(table, self._item(table, key)), transactional))
        return taken

    def after(self, taken: list[tuple[Any, Any, Image, bool]], status: int, answer: Any) -> None:
        """Bill the request, from the images before and the items as they are now: what
        was written or refused by its condition; not a request DynamoDB refused as invalid."""
        if status >= 400 and not any(r in str(answer) for r in CONDITION_REFUSALS):
            return
        for table, key, before, transactional in taken:
            after = image(table, self._item(table, key))
            billed = write_units(before, after, transactional)
            if part := _flow_part(key):
                billed[part] = billed["table"]
            self.billed.update(billed)

    @staticmethod
    def _item(table: Any, key: dict[str, Any]) -> Any:
        from moto.dynamodb.models.dynamo_type import DynamoType

        if table.hash_key_attr not in key or (
            table.range_key_attr and table.range_key_attr not in key
        ):
            return None  # a malformed key: moto refuses the request itself
        hash_key = DynamoType(key[table.hash_key_attr])
        range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
        try:
            return table.get_item(hash_key, range_key)
        except Exception:  # a malformed key: moto refuses the request itself
            return None
