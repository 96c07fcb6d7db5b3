"""Every change the embedded runtime makes to moto's internals (moto 5.2.5), each with
its reason, so a moto upgrade means reading this one file.

Two processes apply them: the runtime's (`step_functions_patches`: the interpreter, its
clients and its Lambda invokes) and the DynamoDB child's (`dynamodb_patches`; the child
serves one request at a time, so the caches these keep are plain dicts). Each patch
replaces one moto function or attribute for as long as its context lasts; none changes
what a request answers, only what moto keeps, repeats or runs at once, except
`routed_invokes`, which hands invocations to the runtime's handlers, and
`waits_until_the_timestamp`, which ends a Wait when AWS's would. `runtime_config` is
what the runtime's process starts moto with.
"""

import base64
import copy
import functools
import hashlib
import json
import pickle
import secrets
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from decimal import Decimal
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


TREES_KEPT = 1024  # parsed expressions kept, and as many of their pickles and checks


@contextmanager
def parsed_update_expressions() -> Iterator[None]:
    """moto parses an UpdateItem's UpdateExpression twice (once to check the request, once
    to carry it out), about a sixth of a conditional write's CPU in its process; here each
    distinct expression is parsed once. A parsed expression is only read: moto's
    validator resolves names and values in a deep copy of it."""
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    parsed = functools.lru_cache(maxsize=TREES_KEPT)(UpdateExpressionParser.make)
    with mock.patch.object(UpdateExpressionParser, "make", parsed):
        yield


_processors: dict[tuple[type, type], Callable[[Any, Any], Any] | None] = {}


def _processor_for(traverser: Any, kind: type) -> Callable[[Any, Any], Any] | None:
    """What a pass of `traverser`'s class does to nodes of class `kind` (None: nothing), as
    moto decides it: the first key of its processing map that `kind` is a subclass of. The
    map's keys are its class's and its values the pass's own methods, so the answer is
    kept per pair of classes, as the method's function."""
    decided = (type(traverser), kind)
    if decided not in _processors:
        found = (p for key, p in traverser._processing_map().items() if issubclass(kind, key))
        processor = next(found, None)
        if processor is not None and not hasattr(processor, "__func__"):
            raise TypeError(f"{decided[0].__name__} processes with a non-method: review this patch")
        _processors[decided] = getattr(processor, "__func__", None)
    return _processors[decided]


@functools.cache
def _is_node(kind: type) -> bool:
    from moto.dynamodb.parsing.ast_nodes import Node

    return issubclass(kind, Node)


@functools.cache
def _holds_clauses(kind: type) -> bool:
    """Whether moto's `find_clauses` looks inside nodes of class `kind`."""
    from moto.dynamodb.parsing.ast_nodes import Expression, UpdateExpressionFunction

    return issubclass(kind, Expression | UpdateExpressionFunction)


def _find_clauses(node: Any, clause_types: list[type]) -> list[Any]:
    """moto's `Node.find_clauses`, step for step, with `isinstance` against its abstract
    classes decided once per class (a validation pass calls it at every node)."""
    clauses = []
    for child in node.children or []:
        kind = type(child)
        if kind in clause_types:
            clauses.append(child)
        elif _holds_clauses(kind):
            clauses.extend(_find_clauses(child, clause_types))
    return clauses


def _traverse(traverser: Any, node: Any, child_id: int = -1) -> Any:
    """moto's depth-first pass (`DepthFirstTraverser.traverse_node_recursively`), step for
    step, with each node's processor looked up by its class."""
    if not _is_node(type(node)):
        return node
    parent = node.parent
    if node.children is not None:
        for i, child in enumerate(node.children):
            traverser.pre_processing_of_child(node, i)
            _traverse(traverser, child, i)
    processor = _processor_for(traverser, type(node))
    if processor is not None:
        node = processor(traverser, node)
        node.parent = parent
        if parent:
            parent.children[child_id] = node
    return node


# By the tree's id, with the tree itself kept alive so that no other object takes its id.
_pickled_trees: dict[int, tuple[Any, bytes]] = {}


def _tree_copy(value: Any, memo: Any = None) -> Any:
    """A deep copy of a parsed expression: a parsed one is only read (each request's copy
    is the one changed), so it is pickled once and each copy made from those bytes."""
    from moto.dynamodb.parsing.ast_nodes import Node

    if not isinstance(value, Node) or memo is not None:
        return copy.deepcopy(value, memo)
    if id(value) not in _pickled_trees:
        if len(_pickled_trees) >= TREES_KEPT:
            _pickled_trees.clear()
        _pickled_trees[id(value)] = (value, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    return pickle.loads(_pickled_trees[id(value)][1])


@contextmanager
def quicker_update_validation() -> Iterator[None]:
    """moto validates an UpdateExpression with ten depth-first passes over a copy of its
    tree, and each pass asked, for every node, which of its processors applies: a map built
    anew and `isinstance` against abstract classes, thousands of times a request, most of a
    final mark's CPU (six SETs and a REMOVE); two passes also gather the clauses below every
    node. Here each pass decides that once per node class, clauses are gathered with the
    classes' answers remembered, and the tree is copied by a pickle round trip, three times
    quicker than `copy.deepcopy` and as deep."""
    from moto.dynamodb.parsing import validators
    from moto.dynamodb.parsing.ast_nodes import DepthFirstTraverser, Node

    with ExitStack() as patches:
        patches.enter_context(
            mock.patch.object(DepthFirstTraverser, "traverse_node_recursively", _traverse)
        )
        patches.enter_context(mock.patch.object(Node, "find_clauses", _find_clauses))
        patches.enter_context(mock.patch.object(validators, "deepcopy", _tree_copy))
        yield


@contextmanager
def expression_checks_once() -> Iterator[None]:
    """Three of the ten passes moto validates an UpdateExpression with read only the
    expression, its attribute names and the table's keys (one clause of each kind, no
    overlapping paths, no key attribute set), so they pass or refuse it the same way every
    time, and they were about half of the validation's CPU (every clause node searches the
    tree below it again). Here they run for the first request of each parsed expression,
    names and keys that they pass; a later request with the same runs the other passes,
    the ones that read its values and the item. One they refuse is checked again each time."""
    from moto.dynamodb.parsing import validators

    expression_only = (
        validators.ActionCountValidator,
        validators.OverlappingPathsValidator,
        validators.UpdateHashRangeKeyValidator,
    )
    init, validate = validators.UpdateExpressionValidator.__init__, validators.Validator.validate
    # By the expression's id, its names and the table's keys; the expression itself is kept
    # alive with its key, so that no other object takes its id.
    passed: dict[tuple[int, str, tuple[str, ...]], Any] = {}

    def checked_init(
        validator: Any,
        expression: Any,
        expression_attribute_names: Any,
        expression_attribute_values: Any,
        item: Any,
        table: Any,
    ) -> None:
        init(
            validator, expression, expression_attribute_names, expression_attribute_values,
            item, table,
        )  # fmt: skip
        names = json.dumps(expression_attribute_names or {}, sort_keys=True)
        key = (id(expression), names, tuple(table.table_key_attrs))
        if key in passed:
            kept = [p for p in validator.processors if not isinstance(p, expression_only)]
            validator.processors = kept
        else:
            validator.checked_as = (key, expression)

    def validate_and_remember(validator: Any) -> Any:
        validated = validate(validator)
        if hasattr(validator, "checked_as"):
            if len(passed) >= TREES_KEPT:
                passed.clear()
            key, expression = validator.checked_as
            passed[key] = expression
        return validated

    with ExitStack() as patches:
        patches.enter_context(
            mock.patch.object(validators.UpdateExpressionValidator, "__init__", checked_init)
        )
        patches.enter_context(
            mock.patch.object(
                validators.UpdateExpressionValidator, "validate", validate_and_remember
            )
        )
        yield


def _condition_key(parser: Any) -> tuple[str, str, tuple[str, ...]]:
    names = json.dumps(parser.expression_attribute_names, sort_keys=True)
    return (
        parser.condition_expression,
        names,
        tuple(sorted(parser.expression_attribute_values or {})),
    )


@contextmanager
def parsed_conditions() -> Iterator[None]:
    """moto parses a conditional write's ConditionExpression twice per request (once to
    check which names and values it uses, once to evaluate it), a third of a claim's CPU in
    its process, and every claim sends the same expression with values of its own. Here
    each expression is parsed once, with its names and the placeholders of its values, and
    each request's condition is made from that tree with its own values: the tree's value
    leaves are looked up by their placeholder (moto looks them up as it parses). The tree
    is only read: making a condition and evaluating it change neither."""
    from moto.dynamodb.comparisons import AttributeValue, ConditionExpressionParser

    parse, make_operand = ConditionExpressionParser.parse, ConditionExpressionParser._make_operand
    trees: dict[tuple[str, str, tuple[str, ...]], tuple[Any, list[str], list[str]]] = {}

    def parse_once(parser: Any) -> Any:
        if not parser.condition_expression:
            return parse(parser)
        key = _condition_key(parser)
        if key not in trees:
            made = parser._make_op_condition
            roots: list[Any] = []

            def first_is_root(node: Any) -> Any:  # moto's parse ends by making the root
                roots.append(node)
                return made(node)

            parser._make_op_condition = first_is_root
            try:
                op = parse(parser)
            finally:
                del parser._make_op_condition
            if len(trees) >= CONDITIONS_KEPT:
                trees.clear()
            trees[key] = (
                roots[0],
                list(parser.expr_attr_names_found),
                list(parser.expr_attr_values_found),
            )
            return op
        tree, names, values = trees[key]
        parser.expr_attr_names_found.extend(names)
        parser.expr_attr_values_found.extend(values)
        return parser._make_op_condition(tree)

    def own_values(parser: Any, node: Any) -> Any:
        if node.kind == parser.Kind.EXPRESSION_ATTRIBUTE_VALUE:
            return AttributeValue(parser._lookup_expression_attribute_value(node.text))
        return make_operand(parser, node)

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(ConditionExpressionParser, "parse", parse_once))
        patches.enter_context(
            mock.patch.object(ConditionExpressionParser, "_make_operand", own_values)
        )
        yield


CONDITIONS_KEPT = 256  # distinct expressions (with their names); a table's writers send few

# DynamoDB's data actions: their answers are items, keys and counts, plain JSON but for
# binary values (base64, as moto's serializer writes them).
DATA_ACTIONS = {
    "GetItem",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "Query",
    "Scan",
    "BatchGetItem",
    "BatchWriteItem",
    "TransactGetItems",
    "TransactWriteItems",
}


def _binary_as_base64(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not plain JSON")


@contextmanager
def plain_json_answers() -> Iterator[None]:
    """moto 5.2 writes every answer through a serializer that walks botocore's shape of the
    operation, member by member (a claim's item: a third of its CPU); a data action's answer
    is already DynamoDB's wire JSON, so here it is written with `json.dumps`. Anything
    else, or an answer `json.dumps` cannot write, goes through moto's serializer."""
    from moto.dynamodb.responses import DynamoHandler

    serialized = DynamoHandler.serialized

    def plain(handler: Any, action_result: Any) -> Any:
        result = action_result.result
        if handler._get_action() in DATA_ACTIONS and isinstance(result, dict):
            try:
                body = json.dumps(result, default=_binary_as_base64)
            except TypeError:
                return serialized(handler, action_result)
            headers = {"Content-Type": "application/x-amz-json-1.0", **handler.response_headers}
            return 200, headers, body
        return serialized(handler, action_result)

    with mock.patch.object(DynamoHandler, "serialized", plain):
        yield


@contextmanager
def quicker_casts() -> Iterator[None]:
    """moto compares two DynamoDB values by their Python values (`DynamoType.cast_value`),
    which asks a value whether it is a number, a set, a list, a map or null before it
    answers: five calls for a string. A query compares every item of the table with its
    key and sorts its partition that way, a condition each attribute it names (`dense`:
    about a sixth of the DynamoDB process's CPU in queries). Here a string answers its
    value and a number its Decimal at once, as moto's own would; any other type goes
    through moto's property (a Query over 6,000 items: 37-42 ms of CPU, then 20-26)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    moto_cast = DynamoType.cast_value.fget

    def cast_value(value: Any) -> Any:
        kind = value.type
        if kind == "S":
            return value.value
        if kind == "N":
            return Decimal(value.value)
        return moto_cast(value)

    with mock.patch.object(DynamoType, "cast_value", property(cast_value)):
        yield


@contextmanager
def quicker_sizes() -> Iterator[None]:
    """moto sizes an item attribute by attribute, each asking whether it is a number, a set,
    a list or a map first, and does so often: a query for each item of the partition it
    reads (against its 1 MB page), an update for the whole item at each attribute it sets
    (against the 400 KB limit). Here a string answers its UTF-8 length and a number the
    length of its digits at once, as moto's own would; any other type goes through moto's
    method (a dispatch Query over 6,000 tasks: 43 ms of CPU, then 37; a claim's update
    1.24 ms, then 1.03). An item adds its attributes' names and values in one loop (a
    query sizes each item of the partition it reads: 1,500 items, 4.1 ms, then 2.6)."""
    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    moto_size = DynamoType.size

    def size(value: Any) -> int:
        kind = value.type
        if kind == "S":
            return len(value.value.encode("utf-8"))
        if kind == "N":
            return len(str(value.value))
        return int(moto_size(value))

    def item_size(item: Any) -> int:
        total = 0
        for name, value in item.attrs.items():
            total += len(name.encode("utf-8")) + size(value)
        return total

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(DynamoType, "size", size))
        patches.enter_context(mock.patch.object(Item, "size", item_size))
        yield


def _every_item(table: Any) -> list[Any]:
    """moto's `Table.all_items`, but in the order the table holds them."""
    if table.range_key_attr:
        return [item for partition in table.items.values() for item in partition.values()]
    return list(table.items.values())


@contextmanager
def quicker_queries() -> Iterator[None]:
    """moto's Query reads every item of the table in key order, keeps the partition it
    asks for, and sorts that again: by the index's keys and the table's (or, on the table,
    by the range key within one partition), an order in which no two items tie, so the
    first sort decides nothing; here a query reads the items as the table holds them. And
    moto sorts by comparing `DynamoType`s, each comparison a few Python calls; here by
    their Python values, which is what those comparisons compare (a key attribute has one
    type). With the quicker item sizes, a dispatch Query over 6,000 tasks took 35 ms of
    CPU, then 28 (queries: a quarter of the DynamoDB process's CPU in `dense`). The
    instance's `all_items` is this query's alone: the process serves one request at a time
    (`_Service.lock`)."""
    from moto.dynamodb.models.table import Table

    query = Table.query

    def unsorted_query(table: Any, *args: Any, **kwargs: Any) -> Any:
        table.all_items = functools.partial(_every_item, table)
        try:
            return query(table, *args, **kwargs)
        finally:
            del table.all_items

    def sorted_items(
        table: Any, hash_key_attrs: list[str], range_key_attrs: list[str | None], items: list[Any]
    ) -> list[Any]:
        attrs = table._generate_attr_to_sort_by(hash_key_attrs, range_key_attrs)
        items.sort(key=lambda item: tuple(item.attrs[attr].cast_value for attr in attrs))
        return items

    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(Table, "query", unsorted_query))
        patches.enter_context(mock.patch.object(Table, "sorted_items", sorted_items))
        yield


@contextmanager
def dynamodb_patches() -> Iterator[None]:
    """What the DynamoDB child runs moto's DynamoDB with."""
    with ExitStack() as patches:
        for patch in (
            no_model_history(),
            item_backed_transactions(),
            parsed_update_expressions(),
            quicker_update_validation(),
            expression_checks_once(),
            parsed_conditions(),
            plain_json_answers(),
            quicker_casts(),
            quicker_sizes(),
            quicker_queries(),
        ):
            patches.enter_context(patch)
        yield


# -- CloudFormation, Step Functions and Lambda, in the runtime's process --------------------


@contextmanager
def backends_released() -> Iterator[None]:
    """moto caches each backend's list of regions with `lru_cache` on a method, so the
    cache keys on the backend and keeps the last 128 alive, with everything they held (a
    stack, its template, its functions and queues), long after their mock has ended: 54,000
    objects and 24 MB a runtime in a process that starts many. At the end, the cache is
    emptied (it only saves botocore's region list a lookup)."""
    from moto.core.base_backend import AccountSpecificBackend

    try:
        yield
    finally:
        AccountSpecificBackend._generate_regions.cache_clear()


@contextmanager
def json_template_bodies() -> Iterator[None]:
    """moto's CloudFormation reads every template body with PyYAML's pure-Python loader,
    JSON ones too: the runtime's translated template (JSON) took a third of a second of
    each start. A body that is JSON is read as JSON; any other as moto reads it."""
    from moto.cloudformation.models import Stack

    parse = Stack.parse_template

    def json_first(template: str) -> dict[str, Any]:
        try:
            return json.loads(template)
        except ValueError:
            return parse(template)

    with mock.patch.object(Stack, "parse_template", staticmethod(json_first)):
        yield


_programs: dict[str, Any] = {}  # a definition's parse, (program, tree), oldest first
PROGRAMS_KEPT = 4  # the runtimes one process runs at once
_programs_lock = threading.Lock()


def _parse_once(parse: Callable[[str], Any], definition: str) -> Any:
    """moto's parse of `definition`, made on its first use (see `parsed_programs`)."""
    with _programs_lock:
        if definition not in _programs:
            parsed = parse(definition)
            _make_heap_keys(parsed[0], set())
            if len(_programs) >= PROGRAMS_KEPT:
                del _programs[next(iter(_programs))]
            _programs[definition] = parsed
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
    """moto parses the ASL to check a new state machine and again for every execution
    (~120 ms of CPU each for the task machine); each definition is parsed once, and every
    execution runs the same program. Its parts keep no state of their own: each
    execution's lives in its environment, under keys the parts make once (made at parse
    time here, so no two threads make them at once)."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    parse = functools.partial(_parse_once, AmazonStateLanguageParser.parse)
    with mock.patch.object(AmazonStateLanguageParser, "parse", staticmethod(parse)):
        yield


@functools.cache
def _symmetric_pair() -> Any:
    """The key pair every symmetric KMS key shares, made once a process."""
    from moto.kms.utils import generate_private_key

    return generate_private_key("SYMMETRIC_DEFAULT")


@contextmanager
def symmetric_keys_share_a_key_pair() -> Iterator[None]:
    """moto makes a 2,048-bit RSA key pair for every KMS key, a symmetric one too (a pair
    is only for Sign and Verify, which AWS refuses on symmetric keys): 50 ms of CPU a key,
    two keys a runtime. Symmetric keys share one pair, made once a process."""
    from moto.kms import models

    generate = models.generate_private_key

    def shared_if_symmetric(key_spec: str) -> Any:
        return _symmetric_pair() if key_spec == "SYMMETRIC_DEFAULT" else generate(key_spec)

    with mock.patch.object(models, "generate_private_key", shared_if_symmetric):
        yield


_NAME_SALT = secrets.token_hex(8)  # this process's
NAMED_IN_THE_MACHINE = ("AWS::Lambda::Function", "AWS::SQS::Queue")


@contextmanager
def stable_resource_names() -> Iterator[None]:
    """moto's CloudFormation ends a physical name with a random suffix, so each runtime's
    task machine named its functions and its dead-letter queue anew and was parsed anew
    (`parsed_programs`): two parses, 40 % of a runtime's start. The suffix of what the
    machine names comes from the stack's name, the resource's logical id and a salt of this
    process instead: the runtimes a process starts in turn name them alike, and no two
    processes do. Tables keep moto's random names: the DynamoDB child goes from one runtime
    to the next, and an old runtime's late write must find no table of the new one."""
    from moto.cloudformation import parsing

    generate = parsing.generate_resource_name

    def stable(resource_type: str, stack_name: str, logical_id: str) -> str:
        if resource_type not in NAMED_IN_THE_MACHINE:
            return generate(resource_type, stack_name, logical_id)
        seed = f"{_NAME_SALT}/{stack_name}/{logical_id}".encode()
        suffix = base64.b32encode(hashlib.blake2b(seed, digest_size=10).digest()).decode()
        with mock.patch.object(parsing, "random_suffix", lambda: suffix[:12]):
            return generate(resource_type, stack_name, logical_id)

    with mock.patch.object(parsing, "generate_resource_name", stable):
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
        # a copy made at once: another thread's import can add a module while a loop
        # over the items runs (Python code can run in between, a collector's finalizer)
        for name, module in sys.modules.copy().items():
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
def waits_until_the_timestamp() -> Iterator[None]:
    """AWS's Wait with a timestamp waits until that second (the timestamp's milliseconds
    are truncated, not the wait); moto's waits the whole seconds left, rounded down, and
    ends up to a second early. Every executor here then slept up to a second longer
    before its gate than on AWS, and the bench priced those GB-seconds."""
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function.timestamp import (
        Timestamp,
    )

    def wait_until(self: Any, env: Any) -> None:
        self.string.eval(env=env)
        given = env.stack.pop()
        until = self._from_timestamp_string(timestamp=given)
        if until is None:
            raise FailureEventException(self._create_failure_event(env, given))
        until = until.replace(tzinfo=UTC)
        while env.is_running() and (left := (until - datetime.now(UTC)).total_seconds()) > 0:
            env.program_state_event.wait(left)

    with mock.patch.object(Timestamp, "_eval_body", wait_until):
        yield


# The runtime's own endpoints on this machine: its DynamoDB process, or DynamoDB Local.
LOCAL_ENDPOINTS = r"http://127\.0\.0\.1:\d+/"


@functools.cache
def _service_models() -> Any:
    """The process's one botocore loader (see `shared_service_models`)."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def shared_service_models() -> None:
    """moto gives each mock a new boto3 session, and with it a new botocore loader: every
    runtime read and parsed each service's model files again, a fifth of its start. boto3's
    default session, new as moto made it, reads them through one loader a process."""
    import boto3
    import botocore.session

    session = botocore.session.get_session()
    session.register_component("data_loader", _service_models())
    boto3.setup_default_session(botocore_session=session)


def runtime_config() -> dict[str, Any]:
    """moto's settings in the runtime's process: Step Functions runs the state machines it
    is given, and a request to one of the runtime's own endpoints goes out at once. moto's
    stubber let those through before too, but only once it had matched each against every
    service's URL patterns: a fifth of a DynamoDB call's CPU here (a claim's UpdateItem,
    1.07 ms of the runtime's CPU, then 0.85)."""
    from moto.core.config import default_user_config

    passthrough = {"urls": [LOCAL_ENDPOINTS], "services": []}
    return {
        "stepfunctions": {"execute_state_machine": True},
        "core": {**default_user_config["core"], "passthrough": passthrough},
    }


@contextmanager
def step_functions_patches(route: Callable[[str, Any, dict[str, str]], bytes]) -> Iterator[None]:
    """What the runtime's process runs moto's Step Functions and Lambda with."""
    with ExitStack() as patches:
        for patch in (
            serialised_starts(),
            waits_until_the_timestamp(),
            routed_invokes(route),
            parsed_programs(),
            stable_resource_names(),
            symmetric_keys_share_a_key_pair(),
            cached_json_paths(),
            shared_service_clients(),
            no_model_history(),
            no_thread_history(),
        ):
            patches.enter_context(patch)
        yield
