"""What a job on MIG slices is billed and charged (``ledger.measure``): its share of the
GPU (compute slices / 7) at the GPU's price, that share of the GPU's power, and usage rows
that keep the slice's model (usage by profile)."""

from __future__ import annotations

import pytest

from gpufleet.migindex import slice_index, slice_parent_model, slice_share_of
from gpufleet.server.decide.pricing import parse_prices
from gpufleet.server.store.ledger import HOUR, Sample, _Open, measure

SCHEDULE = parse_prices({"timezone": "UTC", "base": {"H100-80GB": 7.0}})


def _power(node: str, index: int) -> Sample | None:
    return Sample(power_w=700.0, util_pct=50.0) if (node, index) == ("n1", 1) else None


@pytest.mark.parametrize(
    ("model", "share"),
    [
        ("H100-80GB", 1.0),
        ("H100-80GB MIG 1g.10gb", 1 / 7),
        ("H100-80GB MIG 3g.40gb", 3 / 7),
        ("H100-80GB MIG 7g.80gb", 1.0),
        ("H100-80GB MIG 1g.10gb+me", 1 / 7),
    ],
)
def test_slice_share_of_a_model(model: str, share: float) -> None:
    assert slice_share_of(model) == pytest.approx(share)
    assert slice_parent_model(model) == "H100-80GB"


def test_a_slice_costs_its_share_of_its_gpu_and_of_its_power() -> None:
    job = _Open(
        id=1,
        accrued_to=0.0,
        gpus=2,
        priority=0,
        model="H100-80GB MIG 1g.10gb",
        user_id=1,
        team_id=1,
        pool="p",
    )
    rows = measure(
        job,
        HOUR,
        gpus_at=[("n1", slice_index(1, 0)), ("n1", slice_index(1, 1))],
        schedule=SCHEDULE,
        readings=_power,
    )
    (row,) = rows
    assert row["cost"] == pytest.approx(2 * 7.0 / 7)  # two 1/7 shares of a 7.0/h GPU for an hour
    assert row["gpu_s"] == pytest.approx(2 * HOUR / 7)
    assert row["energy_wh"] == pytest.approx(700.0 * 2 / 7)  # the GPU's 700 W, read twice, 1/7 each
    assert row["gpu_type"] == "H100-80GB MIG 1g.10gb"
    whole = _Open(id=2, accrued_to=0.0, gpus=1, priority=0, model="H100-80GB", user_id=1, team_id=1, pool="p")
    (row,) = measure(whole, HOUR, gpus_at=[("n1", 1)], schedule=SCHEDULE, readings=_power)
    assert row["cost"] == pytest.approx(7.0) and row["energy_wh"] == pytest.approx(700.0)
