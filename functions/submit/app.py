"""Submit queue consumer: schedules the tasks in a batch, parks refused messages with why."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from tocsin.inbox import submit_batch
from tocsin.observability import logger, metrics
from tocsin.tracing import tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return submit_batch(event, context)
