"""What every bench scenario stands on: the `Bench` (its progress display, random source,
size and the runtimes it starts) and tasks written straight to the tables
(`write_items`), as a submission long before their due time leaves them."""

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.progress import Progress

from tocsin import aws
from tocsin.bodies import split
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.measure.cost import Pricing
from tocsin.settings import settings


@dataclass
class Bench:
    """What every scenario shares: the progress display and the random source."""

    progress: Progress
    rng: random.Random
    scale: float = 1.0
    cost: Pricing | None = None  # count billed usage and price it so
    tables: str = "moto"  # where the runtimes keep their tables (TABLE_ENGINES)
    lambda_limits: bool = False  # executors in Lambda-sized sandboxes (tocsin.local.sandbox)
    parameters: dict[str, str] = field(default_factory=dict)  # the caller's, over any scenario's

    def runtime(self, parameters: dict[str, str] | None = None, **options: Any) -> EmbeddedRuntime:
        """A runtime on the bench's tables and limits, with the caller's template parameters
        over the scenario's; no finder ticker unless asked."""
        defaults = {"finder_interval_s": None, "lambda_limits": self.lambda_limits}
        given = {**(parameters or {}), **self.parameters}
        return EmbeddedRuntime(given, tables=self.tables, **(defaults | options))

    def size(self, full: int) -> int:
        return max(5, round(full * self.scale))


def write_items(items: Iterable[dict[str, Any]]) -> None:
    """Tasks' items written in batches, their large bodies apart and first, as
    TaskStore.create writes one (`tocsin.bodies`)."""
    config, dynamodb = settings(), aws.resource("dynamodb")
    stored = [split(whole, config) for whole in items]
    with dynamodb.Table(config.bodies_table).batch_writer() as writer:
        for _, body in stored:
            if body is not None:
                writer.put_item(Item=body)
    with dynamodb.Table(config.tasks_table).batch_writer() as writer:
        for item, _ in stored:
            writer.put_item(Item=item)
