"""What a run costs on one offer: billed compute hours plus storage, egress and snapshots.

    compute  = billed hours × hourly price; billed hours round the wall time up to the offer's billing unit
               (per second, per hour...), or to whole weeks/months for reserved terms
    storage  = (dataset + model + retained checkpoints) GB × price per GB-day × days the run lasts
    egress   = GB downloaded at the end (the trained weights or adapter) × price per GB
    snapshot = GB kept as snapshots × price per GB-month × months kept
All amounts are in the offer's currency; convert with `rentwise.planning.offers.Currency`.
Leaves out: taxes, free-tier quotas (rental platforms waive the first tens of GB of storage), idle time
before and after the run, storage billed while the machine is stopped after the run, and any price the
offer does not state (each such gap is listed in `CostBreakdown.unknown`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rentwise.planning.offers import RESERVED_TERM_H, Offer

SECONDS_PER_HOUR = 3600.0
# An offer without a stated billing unit is planned as billed per started hour (the coarsest common unit),
# so the estimate does not come out lower than the bill.
UNKNOWN_BILLING_UNIT_S = 3600


@dataclass(frozen=True)
class CostBreakdown:
    """Cost of one run on one offer and billing mode, in `currency`."""

    compute: float
    storage: float
    egress: float
    snapshot: float
    currency: str
    billed_hours: float
    unknown: tuple[str, ...] = ()
    """Cost items left at 0 because the offer does not state their price."""

    @property
    def total(self) -> float:
        return self.compute + self.storage + self.egress + self.snapshot


@dataclass(frozen=True)
class DataVolumes:
    """Bytes the run stores and moves, for the storage, egress and snapshot items."""

    stored_bytes: float
    """Peak bytes on the machine's disk: dataset + base model + retained checkpoints."""
    egress_bytes: float
    """Bytes downloaded at the end (the trained weights or adapter)."""
    snapshot_bytes: float = 0.0
    snapshot_months: float = 0.0


def billed_hours(wall_hours: float, billing: str, billing_unit_s: int | None) -> float:
    """Hours on the bill for `wall_hours` of use under `billing` (round up to unit or reserved term)."""
    if wall_hours <= 0:
        return 0.0
    if billing in RESERVED_TERM_H:
        term = RESERVED_TERM_H[billing]
        return math.ceil(wall_hours / term - 1e-9) * term
    unit_h = (billing_unit_s or UNKNOWN_BILLING_UNIT_S) / SECONDS_PER_HOUR
    return math.ceil(wall_hours / unit_h - 1e-9) * unit_h


def run_cost(offer: Offer, billing: str, wall_hours: float, volumes: DataVolumes) -> CostBreakdown:
    """Cost of keeping `offer` for `wall_hours` under `billing`, with the data in `volumes`."""
    price = offer.price_per_hour(billing)
    if price is None:
        raise ValueError(f"offer {offer.id} has no {billing} price")
    hours = billed_hours(wall_hours, billing, offer.billing_unit_s)
    unknown: list[str] = []
    gb = 1e9  # providers bill storage and traffic in decimal GB

    storage = 0.0
    if volumes.stored_bytes > 0:
        if offer.storage_per_gb_day is None:
            unknown.append("storage")
        else:
            storage = volumes.stored_bytes / gb * offer.storage_per_gb_day * wall_hours / 24
    egress = 0.0
    if volumes.egress_bytes > 0:
        if offer.egress_per_gb is None:
            unknown.append("egress")
        else:
            egress = volumes.egress_bytes / gb * offer.egress_per_gb
    snapshot = 0.0
    if volumes.snapshot_bytes > 0 and volumes.snapshot_months > 0:
        if offer.snapshot_per_gb_month is None:
            unknown.append("snapshots")
        else:
            snapshot = volumes.snapshot_bytes / gb * offer.snapshot_per_gb_month * volumes.snapshot_months
    return CostBreakdown(
        compute=hours * price,
        storage=storage,
        egress=egress,
        snapshot=snapshot,
        currency=offer.currency,
        billed_hours=hours,
        unknown=tuple(unknown),
    )
