"""Bulk queue consumer: works one bulk action's job while its time lasts (tocsin.bulk)."""

import json
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from tocsin.bulk import run_job
from tocsin.observability import logger, metrics
from tocsin.settings import settings
from tocsin.tracing import tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    for record in event["Records"]:  # one a batch (BatchSize 1)
        run_job(
            json.loads(record["body"])["bulk_id"], settings(), context.get_remaining_time_in_millis
        )
