"""A Lambda context for handlers run in-process: what Powertools and the finder read from it."""

import time
import uuid
from dataclasses import dataclass, field


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
