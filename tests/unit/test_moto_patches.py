"""The embedded runtime's DynamoDB, as its child process patches moto: a transaction is
backed up item by item, not table by table (one that fails still leaves every item as it
was, and one that succeeds writes); an update expression and a condition are parsed once
for every request that sends them (each request still gets its own names and values);
validation still refuses what moto refuses; and data actions answer as moto's serializer
would."""

import json
from unittest import mock

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest
from moto import mock_aws

from tocsin.local.moto_patches import dynamodb_patches

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python


@pytest.fixture
def table():
    with mock_aws(), dynamodb_patches():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for n in range(50):
            client.put_item(TableName="t", Item={"id": {"S": f"i{n}"}, "n": {"N": "1"}})
        yield client


def update(key: str, condition: str | None = None) -> dict:
    action = {
        "TableName": "t",
        "Key": {"id": {"S": key}},
        "UpdateExpression": "SET n = n + :one",
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }
    if condition:
        action["ConditionExpression"] = condition
    return {"Update": action}


def values(client) -> dict[str, str]:
    items = client.scan(TableName="t")["Items"]
    return {item["id"]["S"]: item["n"]["N"] for item in items}


def test_a_failed_transaction_leaves_every_item_as_it_was(table):
    before = values(table)
    with pytest.raises(table.exceptions.TransactionCanceledException):
        table.transact_write_items(
            TransactItems=[update("i1"), update("i2"), update("i3", "n > :one")]
        )
    assert values(table) == before


def test_a_transaction_that_holds_writes_every_item(table):
    table.transact_write_items(TransactItems=[update("i1"), update("i2")])
    table.transact_write_items(
        TransactItems=[{"Put": {"TableName": "t", "Item": {"id": {"S": "new"}, "n": {"N": "7"}}}}]
    )
    after = values(table)
    assert (after["i1"], after["i2"], after["i3"], after["new"]) == ("2", "2", "1", "7")


def test_one_update_expression_sent_with_other_names_and_values_updates_what_each_names(table):
    """The second and third requests reuse the first's parsed expression: had moto resolved
    names or values into that parse, they would write the first request's attribute."""
    for key, attribute, value in (("i1", "a", "1"), ("i2", "b", "2"), ("i1", "b", "3")):
        table.update_item(
            TableName="t",
            Key={"id": {"S": key}},
            UpdateExpression="SET #x = :v, n = n + :v",
            ExpressionAttributeNames={"#x": attribute},
            ExpressionAttributeValues={":v": {"N": value}},
        )
    items = {item["id"]["S"]: item for item in table.scan(TableName="t")["Items"]}
    assert {k: v["N"] for k, v in items["i1"].items() if k != "id"} == {
        "a": "1",
        "b": "3",
        "n": "5",
    }
    assert {k: v["N"] for k, v in items["i2"].items() if k != "id"} == {"b": "2", "n": "3"}


def test_a_condition_sent_again_with_other_values_is_judged_on_each_requests_values(table):
    """A condition sent again is made from the first request's tree with the values of its
    own request: had the tree kept the first request's values, the third would pass."""
    request = {
        "TableName": "t",
        "Key": {"id": {"S": "i1"}},
        "ConditionExpression": "n = :expected",
        "UpdateExpression": "SET n = :next",
    }
    for expected, following in (("1", "2"), ("2", "3")):
        table.update_item(
            ExpressionAttributeValues={":expected": {"N": expected}, ":next": {"N": following}},
            **request,
        )
    with pytest.raises(table.exceptions.ConditionalCheckFailedException):
        table.update_item(
            ExpressionAttributeValues={":expected": {"N": "2"}, ":next": {"N": "3"}}, **request
        )
    assert values(table)["i1"] == "3"


def test_a_condition_is_parsed_once_for_every_request_that_sends_it(table):
    from moto.dynamodb.comparisons import ConditionExpressionParser

    lexed = []
    lex = ConditionExpressionParser._lex_condition_expression

    def counted(parser):
        lexed.append(parser.condition_expression)
        return lex(parser)

    with mock.patch.object(ConditionExpressionParser, "_lex_condition_expression", counted):
        for key in ("i1", "i2"):
            table.update_item(
                TableName="t",
                Key={"id": {"S": key}},
                UpdateExpression="SET n = :two",
                ConditionExpression="n = :one",
                ExpressionAttributeValues={":one": {"N": "1"}, ":two": {"N": key[1]}},
            )
    assert lexed == ["n = :one"]  # moto parses it twice a request: for what it uses, to judge
    assert (values(table)["i1"], values(table)["i2"]) == ("1", "2")


def test_a_condition_parsed_before_still_counts_the_names_and_values_it_uses(table):
    """moto refuses a name or value that no expression uses, from what the condition's
    parse found: a reused parse must report the same, or the second of two identical
    requests would be refused, and a spare value would pass."""
    request = {
        "TableName": "t",
        "Key": {"id": {"S": "i1"}},
        "UpdateExpression": "SET n = :v",
        "ConditionExpression": "attribute_exists(#k) AND n <> :c",
        "ExpressionAttributeNames": {"#k": "id"},
    }
    used = {":v": {"N": "5"}, ":c": {"N": "0"}}
    for _ in range(2):
        table.update_item(ExpressionAttributeValues=used, **request)
        with pytest.raises(table.exceptions.ClientError, match="unused"):
            table.update_item(ExpressionAttributeValues={**used, ":spare": {"S": "x"}}, **request)
    assert values(table)["i1"] == "5"


def test_update_expressions_are_still_validated_pass_by_pass(table):
    """Every pass of moto's validation still runs on the quicker traversal: overlapping
    paths, a key attribute and a missing value are refused, and nothing is written."""
    before = values(table)
    for update, names, refused in (
        ("SET n = :v, n = :v", {}, "overlap"),
        ("SET #k = :v", {"#k": "id"}, "key"),
        ("SET n = n + :s", {}, "operand"),
    ):
        extra = {"ExpressionAttributeNames": names} if names else {}
        with pytest.raises(table.exceptions.ClientError, match=f"(?i){refused}"):
            table.update_item(
                TableName="t",
                Key={"id": {"S": "i1"}},
                UpdateExpression=update,
                ExpressionAttributeValues={":s": {"S": "x"}}
                if ":s" in update
                else {":v": {"N": "9"}},
                **extra,
            )
    assert values(table) == before


def test_an_expression_checked_before_is_checked_again_with_other_names(table):
    """The checks that read only the expression, its names and the table's keys run once
    for each expression and names they pass: the same expression with a name that points
    at the key, or an expression refused before, is refused each time, and nothing written."""
    from moto.dynamodb.parsing.validators import ActionCountValidator

    def set_a(name: str, value: str = "9") -> None:
        table.update_item(
            TableName="t",
            Key={"id": {"S": "i1"}},
            UpdateExpression="SET #a = :v",
            ExpressionAttributeNames={"#a": name},
            ExpressionAttributeValues={":v": {"N": value}},
        )

    set_a("n")
    before = values(table)
    for _ in range(2):
        with pytest.raises(table.exceptions.ClientError, match=r"(?i)key"):
            set_a("id")
    with mock.patch.object(
        ActionCountValidator, "traverse", autospec=True, side_effect=ActionCountValidator.traverse
    ) as counted:
        set_a("n", "10")
        set_a("n", "11")
    assert counted.call_count == 0  # both passed the checks as the first did
    assert values(table) == before | {"i1": "11"}
    for _ in range(2):
        with pytest.raises(table.exceptions.ClientError, match=r"(?i)overlap"):
            table.update_item(
                TableName="t",
                Key={"id": {"S": "i1"}},
                UpdateExpression="SET n = :v, n = :v",
                ExpressionAttributeValues={":v": {"N": "1"}},
            )
    assert values(table)["i1"] == "11"


EVERY_TYPE = {
    "id": {"S": "every"},
    "n": {"N": "1.50"},
    "b": {"B": b"\x00\xffbytes"},
    "ss": {"SS": ["a", "b"]},
    "ns": {"NS": ["1", "2"]},
    "bs": {"BS": [b"\x01", b"\x02"]},
    "m": {"M": {"nested": {"L": [{"S": "x"}, {"NULL": True}, {"BOOL": False}]}}},
}


def _data_answers() -> list[dict]:
    """One of each data action's answers on a fresh table, without their metadata."""
    client = boto3.client("dynamodb", region_name="us-east-1")
    client.create_table(
        TableName="d",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    key = {"id": EVERY_TYPE["id"]}
    answers = [
        client.put_item(TableName="d", Item=EVERY_TYPE),
        client.put_item(TableName="d", Item=EVERY_TYPE, ReturnValues="ALL_OLD"),
        client.update_item(
            TableName="d",
            Key=key,
            UpdateExpression="SET z = :z",
            ExpressionAttributeValues={":z": {"B": b"z"}},
            ReturnValues="ALL_NEW",
        ),
        client.get_item(TableName="d", Key=key),
        client.query(
            TableName="d",
            KeyConditionExpression="id = :id",
            ExpressionAttributeValues={":id": EVERY_TYPE["id"]},
        ),
        client.scan(TableName="d", Limit=1),
        client.batch_get_item(RequestItems={"d": {"Keys": [key]}}),
        client.transact_get_items(TransactItems=[{"Get": {"TableName": "d", "Key": key}}]),
        client.delete_item(TableName="d", Key=key, ReturnValues="ALL_OLD"),
    ]
    return [{k: v for k, v in a.items() if k != "ResponseMetadata"} for a in answers]


def test_plain_json_answers_are_what_motos_serializer_writes():
    """Every data action's answer, binary values and sets included, reads the same through
    botocore as moto's own serializer's; and the serializer is not used for them."""
    from moto.core.serialize import ResponseSerializer

    with mock_aws():
        by_moto = _data_answers()
    serialized = []
    original = ResponseSerializer.serialize

    def counted(serializer, result):
        serialized.append(serializer.operation_model.name)
        return original(serializer, result)

    with (
        mock_aws(),
        dynamodb_patches(),
        mock.patch.object(ResponseSerializer, "serialize", counted),
    ):
        plain = _data_answers()
    assert plain == by_moto
    assert by_moto[2]["Attributes"]["b"] == {"B": b"\x00\xffbytes"}
    assert serialized == ["CreateTable"]


def _compared() -> list:
    """A query over numbers and strings (two items tied on the index's keys), in both
    orders, and conditions that compare numbers written differently, strings, a map and a
    set: what each answers."""
    client = boto3.client("dynamodb", region_name="us-east-1")
    client.create_table(
        TableName="c",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "id", "AttributeType": "S"},
            {"AttributeName": "p", "AttributeType": "S"},
            {"AttributeName": "due", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "due-index",
                "KeySchema": [
                    {"AttributeName": "p", "KeyType": "HASH"},
                    {"AttributeName": "due", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    # ties with i2's 1.50 on the index's keys, and goes in first: the table's key decides
    client.put_item(TableName="c", Item={"id": {"S": "z0"}, "p": {"S": "a"}, "due": {"N": "1.5"}})
    for n, due in enumerate(["9", "10", "1.50", "-2", "100", "1.5e1", "0.001"]):
        item = {"id": {"S": f"i{n}"}, "p": {"S": "a" if n % 3 else "b"}, "due": {"N": due}}
        item |= {"m": {"M": {"k": {"N": "1"}}}, "s": {"SS": ["x", "y"]}}
        client.put_item(TableName="c", Item=item)
    answers: list = []
    for forward in (True, False):
        answers.append(
            client.query(
                TableName="c",
                IndexName="due-index",
                KeyConditionExpression="p = :p AND due BETWEEN :low AND :high",
                ExpressionAttributeValues={
                    ":p": {"S": "a"},
                    ":low": {"N": "-5"},
                    ":high": {"N": "15"},
                },
                ScanIndexForward=forward,
            )["Items"]
        )
    for condition, value in [  # each expression twice: its tree is made once, then reused
        ("due = :v", {"N": "9.0"}),
        ("due = :v", {"N": "8"}),
        ("due < :v", {"N": "10"}),
        ("due < :v", {"N": "9"}),
        ("p = :v", {"S": "a"}),
        ("p = :v", {"S": "b"}),
        ("begins_with(p, :v)", {"S": "b"}),
        ("begins_with(p, :v)", {"S": "c"}),
        ("size(s) > :v", {"N": "1"}),
        ("size(s) > :v", {"N": "2"}),
        ("m = :v", {"M": {"k": {"N": "1.0"}}}),
        ("m = :v", {"M": {"k": {"N": "2"}}}),
        ("s = :v", {"SS": ["y", "x"]}),
    ]:
        try:
            client.update_item(
                TableName="c",
                Key={"id": {"S": "i0"}},
                UpdateExpression="SET hits = if_not_exists(hits, :zero) + :one",
                ConditionExpression=condition,
                ExpressionAttributeValues={":v": value, ":zero": {"N": "0"}, ":one": {"N": "1"}},
            )
            answers.append((condition, "written"))
        except client.exceptions.ConditionalCheckFailedException:
            answers.append((condition, "refused"))
    return answers


def test_values_compare_and_sort_as_motos_own():
    """Strings and numbers take a quicker path to the values moto compares, and a condition
    sent again is made from its first tree with its own values: a query's order and each
    condition's verdict are moto's, numbers written differently included."""
    with mock_aws():
        by_moto = _compared()
    with mock_aws(), dynamodb_patches():
        patched = _compared()
    assert patched == by_moto
    assert [item["id"]["S"] for item in by_moto[0]] == ["i2", "z0", "i1", "i5"]
    assert [item["due"]["N"] for item in by_moto[0]] == ["1.50", "1.5", "10", "1.5e1"]  # numbers
    assert by_moto[2:4] == [("due = :v", "written"), ("due = :v", "refused")]  # 9.0 is 9
    assert [verdict for _, verdict in by_moto[2:]].count("refused") == 6  # one of each pair


def test_the_runtimes_own_endpoints_go_past_motos_stubber_and_aws_urls_do_not():
    """The runtime's DynamoDB calls go out at once, and every AWS URL is still moto's; the
    rest of moto's core settings are its defaults."""
    from moto.core.botocore_stubber import BotocoreStubber
    from moto.core.config import default_user_config

    from tocsin.local.moto_patches import runtime_config

    stubber = BotocoreStubber()
    with mock_aws(config=runtime_config()):
        assert default_user_config["core"]["mock_credentials"] is True
        with mock.patch("moto.core.botocore_stubber.backend_index") as patterns:
            request = AWSPreparedRequest("POST", "http://127.0.0.1:41234/", {}, b"{}", False)
            assert stubber.process_request(request) is None
        assert not patterns.mock_calls  # let through before any service's pattern was tried
        aws = "https://dynamodb.us-east-1.amazonaws.com/"
        request = AWSPreparedRequest(
            "POST", aws, {"X-Amz-Target": "DynamoDB_20120810.ListTables"}, b"{}", False
        )
        status, _, body = stubber.process_request(request)
        assert (status, json.loads(body)) == (200, {"TableNames": []})


def test_item_sizes_are_motos_own():
    """Strings and numbers take a quicker path to their size (an item's against 400 KB,
    a page's against 1 MB): every type answers as moto sizes it, and so does an item."""
    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    values = [
        {"S": "plain"},
        {"S": "été ✓ 🙂"},
        {"N": "-12.500"},
        {"N": "1e30"},
        {"B": b"\x00\x01"},
        {"BOOL": True},
        {"NULL": True},
        {"SS": ["a", "bé"]},
        {"NS": ["1", "22"]},
        {"L": [{"S": "x"}, {"N": "3"}]},
        {"M": {"k": {"S": "vé"}, "n": {"N": "7"}}},
    ]

    def item() -> Item:
        attrs = {f"a{n}é": value for n, value in enumerate(values)}
        return Item(DynamoType({"S": "k"}), None, {"k": {"S": "k"}} | attrs)

    by_moto = [DynamoType(value).size() for value in values] + [item().size()]
    with dynamodb_patches():
        patched = [DynamoType(value).size() for value in values] + [item().size()]
    assert patched == by_moto
    assert by_moto[:4] == [5, 14, 7, 4]  # UTF-8 bytes; a number's digits as written


def test_a_condition_moto_cannot_parse_is_refused_each_time_it_is_sent(table):
    """A condition that fails to parse leaves no tree behind: the same request fails again
    as moto's own parse fails (a ValueError, where DynamoDB answers ValidationException),
    and a good one after it is judged as usual."""
    request = {
        "TableName": "t",
        "Key": {"id": {"S": "i1"}},
        "UpdateExpression": "SET n = :v",
        "ExpressionAttributeValues": {":v": {"N": "5"}},
    }
    for _ in range(2):
        with pytest.raises(ValueError, match="Bad comparison"):
            table.update_item(ConditionExpression="n = = :v", **request)
    table.update_item(ConditionExpression="attribute_exists(n)", **request)
    assert values(table)["i1"] == "5"
