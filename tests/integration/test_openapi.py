"""The API's OpenAPI document is current, `tocsin serve` serves it, and the API holds to it
under schemathesis's generated requests on every route: no 5xx, every reply as documented,
every refusal in the `{"error": {code, message, field}}` form."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from schemathesis import Case
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tocsin.api import openapi_document
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import PRINCIPAL_HEADER, serving
from tocsin.targets import TARGETS

pytestmark = [
    pytest.mark.slow,  # schemathesis sends up to 100 requests an operation
    # The document and the API's checks (pydantic's) are the same whichever Python serves
    # them; the API's handler runs on the functions' Python in tests/integration/test_api.py.
    pytest.mark.any_python,
]

DOCUMENT = Path(__file__).parents[2] / "docs" / "openapi.json"
schema = schemathesis.openapi.from_path(DOCUMENT)


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    with EmbeddedRuntime(finder_interval_s=None) as runtime, serving(runtime) as url:
        yield url


def test_the_document_is_current():
    assert json.loads(DOCUMENT.read_text()) == openapi_document(), (
        "the API changed: tocsin openapi > docs/openapi.json"
    )


def test_each_task_type_has_its_target_in_the_document():
    """Generated clients and Swagger UI read a task's target from the schema its `type`
    chooses: a target of the type's fields is valid, another type's is not, under a JSON
    Schema validator that is not the API's own (pydantic's)."""
    document = openapi_document()
    registry = Registry().with_resource("doc", Resource.from_contents(document, DRAFT202012))
    validator = Draft202012Validator(
        {"$ref": "doc#/components/schemas/Submission"}, registry=registry
    )
    due = {"due_at": "2030-01-01T00:00:00Z"}
    queue = "https://sqs.us-east-1.amazonaws.com/123456789012/q"
    assert validator.is_valid(due | {"type": "webhook", "target": {"url": "https://a.example"}})
    assert validator.is_valid(due | {"type": "sqs", "target": {"queue_url": queue}})
    assert not validator.is_valid(due | {"type": "webhook", "target": {"queue_url": queue}})
    assert not validator.is_valid(due | {"type": "sqs", "target": {"url": "https://a.example"}})
    schemas = document["components"]["schemas"]
    chosen = schemas["Submission"]["discriminator"]["mapping"]
    assert set(chosen) == {t.value for t in TARGETS}
    for task_type, model in TARGETS.items():
        [task] = [ref.rsplit("/", 1)[1] for t, ref in chosen.items() if t == task_type.value]
        target = schemas[task]["properties"]["target"]["$ref"].rsplit("/", 1)[1]
        assert set(schemas[target]["properties"]) == set(model.model_fields), task_type


def test_serve_serves_the_document_and_swagger_ui(api_url):
    assert requests.get(f"{api_url}/openapi.json", timeout=10).json() == openapi_document()
    page = requests.get(f"{api_url}/swagger", timeout=10)
    assert page.headers["Content-Type"] == "text/html" and "SwaggerUIBundle" in page.text


def refusals_name_their_field(ctx, response, case) -> None:
    """Every 4xx is `{"error": {code, message, field}}`, a field named where one is at fault."""
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert set(error) == {"code", "message", "field"}, error
        assert error["code"] and error["message"], error
        if response.status_code == 400:
            assert error["field"], f"a 400 names the field at fault: {error}"


@schema.parametrize()
@hypothesis_settings(
    max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
def test_every_route_holds_to_the_document(case: Case, api_url):
    """All of schemathesis's checks but one: a request the document allows may still be
    refused for what no schema says (a due time beyond the horizon or long past, both
    `due_at` and `delay`), with a 400 that names the field."""
    case.call_and_validate(
        base_url=api_url,
        headers={PRINCIPAL_HEADER: "fuzzer"},
        additional_checks=[refusals_name_their_field],
        excluded_checks=[positive_data_acceptance],
    )
