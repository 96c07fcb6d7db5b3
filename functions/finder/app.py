"""Finder: on its schedule, settle stuck tasks and start the executions of due ones."""

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from tocsin.finder import run_finder
from tocsin.observability import logger, metrics
from tocsin.settings import settings
from tocsin.tracing import tracer

SAFETY_MARGIN_S = 5  # stop dispatching this long before the Lambda would time out


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    config = settings()
    remaining_s = context.get_remaining_time_in_millis() / 1000 - SAFETY_MARGIN_S
    report = run_finder(config, max(1.0, min(config.finder_budget_s, remaining_s)))
    for name, value in report.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    logger.info("finder run", **report)
    return report
