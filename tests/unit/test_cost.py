"""The bench's prices: provisioned capacity against on demand."""

import pytest

from tocsin.measure.cost import PRICE_PER_UNIT, Pricing

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
