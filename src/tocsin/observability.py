"""The one Logger and Metrics every function shares (service and namespace from the
template's environment). Logs carry task ids and outcomes, never payloads or secrets.

The Tracer lives in `tocsin.tracing`, apart: making one imports the X-Ray SDK and patches
botocore, a tenth of a second of init that an executor cannot spare before its first gate.
Active tracing already traces every invocation; only the finder, API and submit functions,
which no task's lateness waits for, add subsegments for their AWS calls.
"""

from aws_lambda_powertools import Logger, Metrics

logger = Logger(service="tocsin")
metrics = Metrics(namespace="Tocsin", service="tocsin")
