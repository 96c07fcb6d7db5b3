"""Which AWS refusals are worth another attempt: every code botocore's own retries treat as
throttling or as a timeout, any service's code that says it throttles, and a 429 or 5xx;
not a refusal of the request itself."""

import pytest
from botocore.exceptions import ClientError
from botocore.retries.standard import ThrottledRetryableChecker

from tocsin import aws


def refusal(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op"
    )


@pytest.mark.parametrize("code", sorted(ThrottledRetryableChecker._THROTTLED_ERROR_CODES))
def test_every_code_botocore_retries_as_throttling_is_throttling_here(code):
    assert aws.is_throttling(refusal(code)) and aws.is_transient(refusal(code))


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("KMSThrottlingException", 400),
        ("RequestTimeout", 400),
        ("InternalServerError", 500),
        ("ServiceUnavailable", 503),
        ("SomethingNew", 429),
    ],
)
def test_a_service_busy_or_timing_out_is_worth_another_attempt(code, status):
    assert aws.is_transient(refusal(code, status))


@pytest.mark.parametrize(
    "code", ["AccessDeniedException", "ValidationException", "ResourceNotFoundException"]
)
def test_a_refusal_of_the_request_itself_is_not(code):
    assert not aws.is_transient(refusal(code))
