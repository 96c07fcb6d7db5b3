"""The bench's prices: provisioned capacity against on demand, and the finder's runs at a
deployed stack's interval."""

from collections import Counter

import pytest

from tocsin.measure.cost import FINDER, PRICE_PER_UNIT, IdleRun, Pricing, Used

ON_DEMAND = Pricing()


@pytest.mark.parametrize("unit", ["dynamodb_write_units", "dynamodb_index_write_units"])
def test_provisioned_writes_cost_less_than_on_demand_above_about_29_percent_used(unit):
    on_demand = ON_DEMAND.unit_prices()[unit]
    assert Pricing("provisioned", 0.30).unit_prices()[unit] < on_demand
    assert Pricing("provisioned", 0.28).unit_prices()[unit] > on_demand
    # $0.00065 a unit-hour, 70 % of it used: about $0.26 a million writes
    assert Pricing("provisioned", 0.70).unit_prices()[unit] * 1e6 == pytest.approx(0.258, abs=0.001)


def test_provisioned_pricing_changes_dynamodb_only():
    provisioned = Pricing("provisioned", 0.70).unit_prices()
    changed = {unit for unit, price in PRICE_PER_UNIT.items() if provisioned[unit] != price}
    assert changed == {"dynamodb_write_units", "dynamodb_index_write_units", "dynamodb_reads"}
    assert Pricing("provisioned", 0.70).label() == "provisioned, 70% used"


IDLE = IdleRun(Counter({"Query": 18, "GetItem": 2}), Counter({"table": 2}), ms=80)


def used(finder_runs: int, wall_s: float) -> Used:
    usage = Counter({(FINDER, "invocations"): finder_runs, (FINDER, "ms"): 100 * finder_runs})
    usage[("ApiFunction", "invocations")] = 7
    return Used(usage, Counter({"Query": 400, "PutItem": 9}), Counter({"table": 40}), wall_s)


def test_finder_runs_a_deployed_stack_would_not_make_are_left_out_as_idle_runs():
    scenario = used(finder_runs=20, wall_s=100)  # a run every 5 s; on AWS two, a minute apart
    assert scenario.at_finder_interval(IDLE) == 2
    left_out = 18
    assert scenario.usage[FINDER, "invocations"] == 2
    assert scenario.usage[FINDER, "ms"] == 2000 - left_out * 80
    assert scenario.requests == Counter({"Query": 400 - left_out * 18, "PutItem": 9})
    assert scenario.requests["GetItem"] == 0  # never below nothing
    assert scenario.write_units == Counter({"table": 40 - left_out * 2})
    assert scenario.usage["ApiFunction", "invocations"] == 7  # the rest as it was


def test_a_scenario_with_no_more_runs_than_a_deployed_stack_is_priced_as_run():
    scenario = used(finder_runs=3, wall_s=600)
    assert scenario.at_finder_interval(IDLE) == 3
    assert scenario == used(finder_runs=3, wall_s=600)
