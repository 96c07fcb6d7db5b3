"""The X-Ray Tracer of the functions off the fire path (see `tocsin.observability`)."""

from aws_lambda_powertools import Tracer

tracer = Tracer(service="tocsin")
