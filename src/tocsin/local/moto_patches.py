"""Every change the embedded runtime makes to moto's internals (moto 5.2.5), each with
its reason, so a moto upgrade means reading this one file.

Two processes apply them: the runtime's (`step_functions_patches`: the interpreter, its
clients and its Lambda invokes) and the DynamoDB child's (`dynamodb_patches`). Each patch
replaces one moto function or attribute for as long as its context lasts; none changes
what a request answers, only what moto keeps, repeats or runs at once, except
`routed_invokes`, which hands invocations to the runtime's handlers.
"""

import copy
import functools
import threading
import weakref
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


@contextmanager
def parsed_update_expressions() -> Iterator[None]:
    """moto parses an UpdateItem's UpdateExpression twice (once to check the request, once
    to carry it out), about a sixth of a conditional write's CPU in its process; here each
    distinct expression is parsed once. A parsed expression is only read: moto's
    validator resolves names and values in a deep copy of it."""
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    parsed = functools.lru_cache(maxsize=1024)(UpdateExpressionParser.make)
    with mock.patch.object(UpdateExpressionParser, "make", parsed):
        yield


@contextmanager
def dynamodb_patches() -> Iterator[None]:
    """What the DynamoDB child runs moto's DynamoDB with."""
    with no_model_history(), item_backed_transactions(), parsed_update_expressions():
        yield


# -- Step Functions and Lambda, in the runtime's process ------------------------------------

_programs: dict[str, Any] = {}
_programs_lock = threading.Lock()


def _parsed_program(worker: Any) -> Any:
    return parse_once(worker._evaluation_details.state_machine_details.definition)


def parse_once(definition: str) -> Any:
    """The program of `definition`, parsed on its first use (see `parsed_programs`)."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    with _programs_lock:
        if definition not in _programs:
            program = AmazonStateLanguageParser.parse(definition)[0]
            _make_heap_keys(program, set())
            _programs[definition] = program
        return _programs[definition]


def _make_heap_keys(part: Any, seen: set[int]) -> None:
    """Touch `heap_key` on every evaluable part of a parsed program (it is made lazily)."""
    from moto.stepfunctions.parser.asl.component.component import Component
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent

    if id(part) in seen:
        return
    seen.add(id(part))
    if isinstance(part, EvalComponent):
        part.heap_key  # noqa: B018
    if isinstance(part, Component):
        children: Any = vars(part).values()
    elif isinstance(part, dict):
        children = part.values()
    elif isinstance(part, list | tuple):
        children = part
    else:
        return
    for child in children:
        _make_heap_keys(child, seen)


@contextmanager
def parsed_programs() -> Iterator[None]:
    """moto parses the ASL again for every execution (~190 ms of CPU for the task machine);
    each definition is parsed once and every execution runs the same program. Its parts
    keep no state of their own: each execution's lives in its environment, under keys the
    parts make once (made at parse time here, so no two threads make them at once)."""
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    with mock.patch.object(ExecutionWorker, "_get_evaluation_entrypoint", _parsed_program):
        yield


@contextmanager
def serialised_starts() -> Iterator[None]:
    """StartExecution is atomic on AWS; moto's checks the name, then adds the execution, in
    steps, so two starts of one name racing could both run. Here one start runs at a time."""
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    lock = threading.RLock()
    start = StepFunctionsParserBackend.start_execution

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return start(*args, **kwargs)

    with mock.patch.object(StepFunctionsParserBackend, "start_execution", locked):
        yield


@contextmanager
def cached_json_paths() -> Iterator[None]:
    """moto builds a new JSONPath parser (a yacc table) for every path it evaluates, a few
    ms each, many per execution; a parsed path is only read, so each is parsed once."""
    import importlib

    prefix = "moto.stepfunctions.parser.asl."
    with ExitStack() as patches:
        for name in ("utils.json_path", "component.common.path.result_path"):
            module = importlib.import_module(prefix + name)
            cached = functools.lru_cache(maxsize=1024)(module.parse)
            patches.enter_context(mock.patch.object(module, "parse", cached))
        yield


@contextmanager
def shared_service_clients() -> Iterator[None]:
    """moto builds a new boto3 client for every service task (~5-100 ms of CPU each, three
    per task); the task machine's states share one client per service instead."""
    import importlib

    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()
    prefix = "moto.stepfunctions.parser.asl.component.state.exec.state_task."
    modules = (
        "lambda_eval_utils",
        "service.state_task_service_dynamodb",
        "service.state_task_service_sqs",
    )
    with ExitStack() as patches:
        for name in modules:
            module = importlib.import_module(prefix + name)

            def shared(
                region: str,
                service: str,
                state_credentials: Any = None,
                create: Callable[..., Any] = module.boto_client_for,
            ) -> Any:
                with lock:
                    if (region, service) not in clients:
                        clients[region, service] = create(region, service, state_credentials)
                    return clients[region, service]

            patches.enter_context(mock.patch.object(module, "boto_client_for", shared))
        yield


class _RunningThreads(weakref.WeakSet[threading.Thread]):
    """Where moto's interpreter lists its threads: a thread is dropped once it ends."""

    def append(self, thread: threading.Thread) -> None:
        self.add(thread)


@contextmanager
def no_thread_history() -> Iterator[None]:
    """moto's interpreter keeps every thread it starts in a list that only grows; here a
    list keeps only the threads still running."""
    import sys

    from moto.stepfunctions.parser.asl.parse import asl_parser  # noqa: F401 (its modules)

    running_only = _RunningThreads()
    with ExitStack() as patches:
        for name, module in list(sys.modules.items()):
            if name.startswith("moto.stepfunctions.parser") and hasattr(module, "TMP_THREADS"):
                patches.enter_context(mock.patch.object(module, "TMP_THREADS", running_only))
        yield


@contextmanager
def routed_invokes(route: Callable[[str, Any, dict[str, str]], bytes]) -> Iterator[None]:
    """moto's Lambda runs functions in Docker; here `route(name, body, response_headers)`
    runs them: the runtime's handlers from template.yaml, in its own process."""
    from moto.awslambda.models import LambdaBackend

    def invoke(backend: Any, function_name: str, qualifier: Any, body: Any, *rest: Any) -> bytes:
        name = backend.get_function(function_name, qualifier).function_name
        return route(name, body, rest[-1])

    with mock.patch.object(LambdaBackend, "invoke", invoke):
        yield


@contextmanager
def step_functions_patches(route: Callable[[str, Any, dict[str, str]], bytes]) -> Iterator[None]:
    """What the runtime's process runs moto's Step Functions and Lambda with."""
    with ExitStack() as patches:
        for patch in (
            serialised_starts(),
            routed_invokes(route),
            parsed_programs(),
            cached_json_paths(),
            shared_service_clients(),
            no_model_history(),
            no_thread_history(),
        ):
            patches.enter_context(patch)
        yield
