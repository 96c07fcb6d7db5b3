"""The one Logger, Tracer and Metrics every function shares (service and namespace from the
template's environment). Logs carry task ids and outcomes, never payloads or secrets."""

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="tocsin")
tracer = Tracer(service="tocsin")
metrics = Metrics(namespace="Tocsin", service="tocsin")
