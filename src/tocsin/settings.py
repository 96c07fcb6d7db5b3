"""Configuration, parsed once from the environment the template sets on every function."""

import os
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, field_validator

# An executor gives each task of its batch a thread, and Lambda allows 1,024 threads and
# processes per execution environment; 800 tasks of 64-character ids make 100 KB of
# execution input, well inside Step Functions' 256 KB.
BATCH_SIZE_LIMIT = 800
MAX_PAYLOAD_BYTES = 200 * 1024  # a DynamoDB item is 400 KB; the payload never enters Step Functions
NEW_TABLE_WRITES_PER_SECOND = 4000  # what a new on-demand table sustains before it scales
CONNECT_TIMEOUT_S = 3.0  # every SDK or webhook connection's (tocsin.aws)
READ_TIMEOUT_S = 10.0  # an SDK call's wait for its answer (tocsin.aws)
WEBHOOK_CONNECT_TRIES = 3  # a webhook connection refused or timed out, within one attempt
# A flow's limits (tocsin.flow): its plans, retries and late sends write its key's ledger
# item, and DynamoDB takes about 1,000 writes a second on one; a key's leases are read in
# one BatchGetItem.
MAX_FLOW_RATE = 1000
MAX_FLOW_PARALLELISM = 100


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    tasks_table: str = Field("", alias="TASKS_TABLE")
    sent_table: str = Field("", alias="SENT_TABLE")
    bodies_table: str = Field("", alias="BODIES_TABLE")
    schedules_table: str = Field("", alias="SCHEDULES_TABLE")
    state_machine_arn: str = Field("", alias="STATE_MACHINE_ARN")
    lookahead_s: int = Field(180, alias="LOOKAHEAD_SECONDS", ge=1)
    lead_ms: int = Field(2000, alias="LEAD_MS", ge=0)
    prepare_ms_per_task: int = Field(30, alias="PREPARE_MS_PER_TASK", ge=0, le=50)
    shards: int = Field(8, alias="SHARD_COUNT", ge=1, le=64)
    wakes_per_second: int = Field(300, alias="WAKES_PER_SECOND", ge=1)
    concurrency_budget: int = Field(900, alias="CONCURRENCY_BUDGET", ge=1, le=10_000)
    table_warm_writes_per_second: int = Field(0, alias="TABLE_WARM_WRITES_PER_SECOND", ge=0)
    # With provisioned capacity: the write units the Tasks table and its due index have now,
    # as the finder reads them at each run (`tocsin.finder.at_the_tables_rate`); 0 on demand.
    provisioned_writes_per_second: int = Field(0, alias="PROVISIONED_WRITES_PER_SECOND", ge=0)
    batch_window_ms: int = Field(1000, alias="BATCH_WINDOW_MS", ge=1, le=10_000)
    batch_size: int = Field(500, alias="BATCH_SIZE", ge=1, le=BATCH_SIZE_LIMIT)
    burst_sends: int = Field(60, alias="BURST_SENDS_PER_INVOCATION", ge=1, le=BATCH_SIZE_LIMIT)
    retention_days: int = Field(30, alias="RETENTION_DAYS", ge=1)
    horizon_days: int = Field(365, alias="HORIZON_DAYS", ge=1)
    max_overdue_s: int = Field(300, alias="MAX_OVERDUE_SECONDS", ge=0)
    finder_budget_s: float = Field(45, alias="FINDER_BUDGET_SECONDS", gt=0)
    dispatch_workers: int = Field(16, alias="DISPATCH_WORKERS", ge=1)
    dead_letter_queue_url: str = Field("", alias="DEAD_LETTER_QUEUE_URL")
    submit_dead_letter_queue_url: str = Field("", alias="SUBMIT_DEAD_LETTER_QUEUE_URL")
    bulk_queue_url: str = Field("", alias="BULK_QUEUE_URL")
    webhook_secret_arn: str = Field("", alias="WEBHOOK_SECRET_ARN")
    webhook_allowed_hosts: frozenset[str] = Field(frozenset(), alias="WEBHOOK_ALLOWED_HOSTS")
    # The flow of a webhook task that names none, keyed by its URL's host (0: no limit).
    host_flow_rate: int = Field(0, alias="HOST_FLOW_RATE", ge=0, le=MAX_FLOW_RATE)
    host_flow_parallelism: int = Field(
        0, alias="HOST_FLOW_PARALLELISM", ge=0, le=MAX_FLOW_PARALLELISM
    )
    # A failing host held back (`tocsin.holds`): after this many failed sends in a row
    # across one owner's tasks (0: never), and its waiting tasks woken at this rate.
    host_hold_failures: int = Field(5, alias="HOST_HOLD_FAILURES", ge=0, le=100)
    host_recovery_rate: int = Field(20, alias="HOST_RECOVERY_RATE", ge=1, le=MAX_FLOW_RATE)
    # At most 20 s: a webhook attempt must fit an executor's time after its last gate.
    webhook_timeout_s: float = Field(10, alias="WEBHOOK_TIMEOUT_SECONDS", gt=0, le=20)

    @property
    def webhook_attempt_limit_s(self) -> float:
        """The longest one webhook send can take: connecting, tried WEBHOOK_CONNECT_TRIES
        times, then waiting for the answer."""
        timeout = self.webhook_timeout_s
        return WEBHOOK_CONNECT_TRIES * min(CONNECT_TIMEOUT_S, timeout) + timeout

    @property
    def claims_per_second(self) -> int:
        """Tasks the executors may claim in one second: one write each on the Tasks table,
        at the rate it is provisioned for, or on demand at the rate it is warmed for."""
        if self.provisioned_writes_per_second:
            return self.provisioned_writes_per_second
        return max(self.table_warm_writes_per_second, NEW_TABLE_WRITES_PER_SECOND)

    def expires_at(self, due_ms: int) -> int:
        """When DynamoDB's TTL deletes a finished task due at `due_ms` (epoch seconds)."""
        return due_ms // 1000 + self.retention_days * 86_400

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(h.strip().lower() for h in value.split(",") if h.strip())
        return value


@cache
def settings() -> Settings:
    """The settings of this process (cached: the environment does not change in a Lambda)."""
    return Settings.model_validate(dict(os.environ))
