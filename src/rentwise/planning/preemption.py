"""What spot interruptions cost a run: checkpoint interval, expected preemptions, lost work and extra hours.

Model (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
2006): interruptions arrive at random (exponential, mean time between interruptions M); every τ seconds of
compute the job writes a checkpoint taking δ; after an interruption it spends R restarting and redoes the
work since the last checkpoint. Expected wall time for T_s seconds of compute (Daly eq. 13):
    T_w = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T_s / τ
Daly's optimum τ (eq. 37) refines Young's √(2·δ·M) (CACM 17(9), 1974); the one implementation lives in
`rentwise.training.preemption.daly_interval_s`, which the training runner uses too. Expected interruptions
≈ T_w / M; expected lost work per interruption ≈ τ/2 + R for τ ≪ M (shared/data/README.md).
Leaves out: correlated interruptions (a whole zone reclaimed at once), time waiting for capacity after an
interruption (not billed on most clouds) and the provider's notice period (work saved in it is not lost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rentwise.training.preemption import daly_interval_s

# ASSUMPTION, not sourced: providers publish interruption *rates* per instance type (AWS's Spot Instance
# Advisor buckets) but no mean time between interruptions that holds across offers. 24 h is a planning
# default; set `spot_mtbi_h` per offer in the offers file or pass --spot-mtbi.
DEFAULT_SPOT_MTBI_H = 24.0
# ASSUMPTION: a restart takes a new instance boot, environment setup and checkpoint load; 10 minutes is the
# R of the worked examples in Daly 2006 (δ = 5 min, R = 10 min), not a measured cloud figure.
DEFAULT_RESTART_S = 600.0


@dataclass(frozen=True)
class PreemptionCost:
    """Expected effect of random interruptions on one run."""

    compute_s: float
    """Useful compute the job needs (no interruptions, no checkpoints)."""
    interval_s: float
    """Compute between checkpoints (Daly's optimum, or the fixed interval given)."""
    checkpoint_s: float
    """Time to write one checkpoint (δ)."""
    restart_s: float
    mtbi_s: float
    wall_s: float
    """Expected wall-clock time including checkpoints, lost work and restarts."""

    @property
    def expected_interruptions(self) -> float:
        return self.wall_s / self.mtbi_s if math.isfinite(self.mtbi_s) else 0.0

    @property
    def checkpoint_overhead_s(self) -> float:
        """Time spent writing checkpoints: one per interval of compute."""
        return self.compute_s / self.interval_s * self.checkpoint_s if self.interval_s > 0 else 0.0

    @property
    def lost_s(self) -> float:
        """Expected rework plus restarts: the wall time that is neither compute nor checkpoint writing."""
        return max(self.wall_s - self.compute_s - self.checkpoint_overhead_s, 0.0)


def expected_wall_s(
    compute_s: float, interval_s: float, checkpoint_s: float, restart_s: float, mtbi_s: float
) -> float:
    """Daly's expected wall time (eq. 13) for `compute_s` of work; no interruptions when M is infinite."""
    if compute_s <= 0:
        return 0.0
    if not math.isfinite(mtbi_s):
        return compute_s + compute_s / interval_s * checkpoint_s
    m = mtbi_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) * compute_s / interval_s


def preemption_cost(
    compute_s: float, checkpoint_s: float, mtbi_s: float, restart_s: float = DEFAULT_RESTART_S,
    interval_s: float | None = None,
) -> PreemptionCost:  # fmt: skip
    """Expected wall time of `compute_s` under interruptions every `mtbi_s` on average (inf = never).

    The checkpoint interval is Daly's optimum unless `interval_s` is given; a run shorter than one interval
    writes no intermediate checkpoint but still risks losing everything.
    """
    if math.isfinite(mtbi_s):
        tau = interval_s or daly_interval_s(max(checkpoint_s, 1e-9), mtbi_s)
    else:
        tau = interval_s or math.inf
    if math.isinf(tau) or tau >= compute_s:
        # One final save only: the run is one "interval" long.
        tau = max(compute_s, 1e-9)
        wall = expected_wall_s(compute_s, tau, 0.0, restart_s, mtbi_s)
        return PreemptionCost(compute_s, tau, 0.0, restart_s, mtbi_s, wall)
    wall = expected_wall_s(compute_s, tau, checkpoint_s, restart_s, mtbi_s)
    return PreemptionCost(compute_s, tau, checkpoint_s, restart_s, mtbi_s, wall)
