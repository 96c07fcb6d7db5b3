"""A function's handler loaded as Lambda loads it, and the Lambda context it is given: what
Powertools and the finder read from it. Light (no moto): a sandboxed environment's child
process imports it too (`tocsin.local.sandbox`)."""

import importlib.util
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def load_handler(code_dir: Path, handler: str, logical_id: str) -> Callable[[Any, Any], Any]:
    """The template's `Handler` (module.attribute) from the function's code folder."""
    module_name, attribute = handler.rsplit(".", 1)
    path = code_dir / f"{module_name.replace('.', '/')}.py"
    spec = importlib.util.spec_from_file_location(f"tocsin_function_{logical_id}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attribute)


@dataclass
class LocalLambdaContext:
    function_name: str
    invoked_function_arn: str
    timeout_s: float
    memory_limit_in_mb: int = 256
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.started + self.timeout_s - time.monotonic()) * 1000))
