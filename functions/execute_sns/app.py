"""The sns executor: gate to the due millisecond, then act once (see tocsin.fire)."""

from tocsin.fire.executor import executor_handler
from tocsin.model import TaskType

handler = executor_handler(TaskType.SNS)
