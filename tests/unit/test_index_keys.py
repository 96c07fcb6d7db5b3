"""Where a task sits in the dispatch index: a due shard or a check shard."""

from tocsin.index_keys import check_keys, due_index_keys, in_check_shard, shard_of
from tocsin.settings import Settings


def test_a_task_is_in_a_check_shard_only_when_its_entry_is_in_one():
    config = Settings(SHARD_COUNT=4)
    looked_at = {"task_id": "t", **check_keys("t", 1_000, config)}
    due = {"task_id": "t", **due_index_keys("t", 1_000, config, now_ms=500)}
    assert in_check_shard(looked_at)
    assert not in_check_shard(due)  # "3", say: a due shard's name is a number
    assert not in_check_shard({"task_id": "t"})  # out of the index: settled and taken out
    assert looked_at["gsi_pk"] == f"check-{shard_of('t', 4)}" and looked_at["gsi_due_ms"] == 1_000
