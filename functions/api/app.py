"""Task API: POST/GET/PATCH/DELETE /tasks behind the HTTP API's IAM authorizer."""

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from tocsin.api import resolve
from tocsin.observability import logger, metrics
from tocsin.tracing import tracer


@logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True
)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return resolve(event, context)
