"""moto without its dashboard's memory, and DynamoDB transactions without whole-table
backups: what both of the runtime's processes patch."""

import copy
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock


def _untracked(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


@contextmanager
def no_model_history() -> Iterator[None]:
    """moto records every model object in a class list for its dashboard (an Item for each
    copy an UpdateItem makes), a list that only grows; here none is kept. moto also looks
    up a handler's methods once per class, rather than on every request."""
    from moto.core import responses
    from moto.core.common_models import BaseModel

    cached = functools.cache(responses.method_names_from_class)
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(BaseModel, "__new__", _untracked))
        patches.enter_context(mock.patch.object(responses, "method_names_from_class", cached))
        yield


class _TableSnapshots:
    """The `copy` module, as moto's DynamoDB models see it while one transaction runs.

    moto backs up every table a transaction touches with `copy.deepcopy(table)`, to put
    it back if the transaction fails: a cost that grows with the table (seconds a
    transaction for a few thousand items; a schedule's every occurrence is one). Here the
    backup is the table with a copy of its index of items, and deep copies of only the
    items the transaction names: what a failed transaction can have changed."""

    def __init__(self, keys: dict[str, list[dict[str, Any]]]):
        self._keys = keys

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.dynamo_type import DynamoType
        from moto.dynamodb.models.table import Table

        if not isinstance(value, Table):
            return copy.deepcopy(value, memo)
        snapshot = copy.copy(value)
        snapshot.items = value.items.copy()  # the same entries; keys keep their hashes
        for key in self._keys.get(value.name, []):
            hash_key = DynamoType(key[value.hash_key_attr])
            if hash_key not in value.items:
                continue
            if value.range_key_attr:  # a partition of items by range key: its own copy
                range_key = DynamoType(key[value.range_key_attr])
                partition = dict(snapshot.items[hash_key])
                if range_key in partition:
                    partition[range_key] = copy.deepcopy(value.items[hash_key][range_key])
                snapshot.items[hash_key] = partition
            else:
                snapshot.items[hash_key] = copy.deepcopy(value.items[hash_key])
        return snapshot


def _transactions_backing_up_items(transact: Callable[..., Any]) -> Callable[..., Any]:
    def backing_up_items(backend: Any, transact_items: list[dict[str, Any]]) -> Any:
        from moto.dynamodb import models

        keys: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in transact_items:
            action = next(iter(entry.values()))
            keys[action.get("TableName", "")].append(action.get("Key") or action.get("Item", {}))
        with mock.patch.object(models, "copy", _TableSnapshots(keys)):
            return transact(backend, transact_items)

    return backing_up_items


@contextmanager
def item_backed_transactions() -> Iterator[None]:
    """DynamoDB's TransactWriteItems backed up item by item (see _TableSnapshots)."""
    from moto.dynamodb.models import DynamoDBBackend

    transact = DynamoDBBackend.transact_write_items
    patched = _transactions_backing_up_items(transact)
    with mock.patch.object(DynamoDBBackend, "transact_write_items", patched):
        yield
