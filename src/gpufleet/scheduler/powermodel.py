"""Rack power budgets as the scheduler's snapshot carries them, and how a GPU's draw is
estimated (the pass that enforces them is ``power.py``).

The model, per rack with a budget (everything in watts):

    draw = sum over its nodes of  base
                                 + for each GPU:  measured  if the snapshot has a reading
                                                            (a busy GPU's only once its job
                                                            has run ``settle_s``)
                                                  else board power (TDP)   if a job holds it
                                                  else idle_fraction x board power

- *board power* of a GPU: the operator's figure for its node, else for its model, else
  ``board_power_w`` (a table of common models, by NVIDIA's board specifications, and
  ``DEFAULT_BOARD_W`` for a model it does not know: the largest common figure, so an
  unknown model is never under-counted);
- *base*: CPUs, memory, NICs, NVSwitches and fans: the operator's figure for the node,
  else ``default_base_w`` (500 W + 125 W per GPU: 1.5 kW for an 8-GPU server);
- a MIG slice or a GPU share is its part of its GPU (``migindex.slice_share_of``: compute
  slices / 7, a share unit 1/100), read from the table by its parent GPU's model; no
  reading is used for it (readings are per physical GPU), and the node it belongs to
  carries the base.

A job about to start is counted at board power (it has not drawn anything yet); the
rack's cap is ``budget x (1 - headroom)``, which is what absorbs a running job's swings
above its last reading. Pure data: no clock, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_BOARD_W",
    "DEFAULT_IDLE_FRACTION",
    "DEFAULT_SETTLE_S",
    "PowerModel",
    "RackBudget",
    "board_power_w",
    "default_base_w",
]

DEFAULT_BOARD_W = 700.0
"""Board power of a GPU model the table does not know (H100 SXM's: the largest common one
but B200's, so a budget errs on the safe side)."""
DEFAULT_IDLE_FRACTION = 0.10
"""An idle GPU's draw as a share of its board power (an idle H100 SXM reads 60-75 W)."""
DEFAULT_SETTLE_S = 60.0
"""A busy GPU's reading is trusted once its job has run this long (before: loading data)."""

# (model token, tokens that must also be in the name, board power W). First match wins,
# so the more specific rows of a model come first. Names are NVML's ("NVIDIA H100 80GB
# HBM3" is the SXM board, "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe") or short
# ("H100-80GB"): split into lower-case words.
_TABLE: tuple[tuple[str, frozenset[str], float], ...] = (
    ("b200", frozenset(), 1000.0),
    ("h200", frozenset({"nvl"}), 600.0),
    ("h200", frozenset(), 700.0),
    ("h100", frozenset({"pcie"}), 350.0),
    ("h100", frozenset({"nvl"}), 400.0),
    ("h100", frozenset(), 700.0),
    ("h800", frozenset({"pcie"}), 350.0),
    ("h800", frozenset(), 700.0),
    ("a100", frozenset({"pcie", "80gb"}), 300.0),
    ("a100", frozenset({"pcie"}), 250.0),
    ("a100", frozenset(), 400.0),
    ("a800", frozenset({"pcie"}), 300.0),
    ("a800", frozenset(), 400.0),
    ("l40s", frozenset(), 350.0),
    ("l40", frozenset(), 300.0),
    ("l4", frozenset(), 72.0),
    ("a40", frozenset(), 300.0),
    ("a30", frozenset(), 165.0),
    ("a10", frozenset(), 150.0),
    ("a6000", frozenset(), 300.0),
    ("v100", frozenset({"pcie"}), 250.0),
    ("v100s", frozenset(), 250.0),
    ("v100", frozenset(), 300.0),
    ("t4", frozenset(), 70.0),
)
_WORD = re.compile(r"[a-z0-9]+")


def board_power_w(model: str) -> float:
    """The board power (TDP) of a GPU model by name; ``DEFAULT_BOARD_W`` if unknown."""
    words = set(_WORD.findall(model.lower()))
    for token, also, watts in _TABLE:
        if token in words and also <= words:
            return watts
    return DEFAULT_BOARD_W


def default_base_w(gpus: int) -> float:
    """What a node draws besides its GPUs when none is declared: 500 W + 125 W a GPU."""
    return 500.0 + 125.0 * gpus


@dataclass(frozen=True, slots=True, kw_only=True)
class RackBudget:
    """A rack's power feed (``gpufleet admin rack set``): new work starts in it only while
    its estimated draw stays within ``cap_w``, the budget less its headroom."""

    rack: str
    budget_w: float
    headroom: float = 0.3
    """The share of the budget kept free, 0 <= headroom < 1."""

    def __post_init__(self) -> None:
        if not self.budget_w > 0 or not 0 <= self.headroom < 1:
            raise ValueError(f"rack {self.rack}: budget must be > 0 W and headroom in [0, 1)")

    @property
    def cap_w(self) -> float:
        return self.budget_w * (1.0 - self.headroom)


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerModel:
    """Everything the pass needs to estimate racks' draw (see the module docstring).
    Racks without a budget are not estimated and never hold a job back."""

    racks: tuple[RackBudget, ...]
    board_w: tuple[tuple[str, float], ...] = ()
    """GPU model -> its board power, over the table's."""
    node_board_w: tuple[tuple[str, float], ...] = ()
    """Node -> its GPUs' board power, over the model's."""
    node_base_w: tuple[tuple[str, float], ...] = ()
    """Node -> its base draw, over ``default_base_w``."""
    measured: tuple[tuple[str, int, float], ...] = ()
    """(node, GPU index, watts): recent readings of whole GPUs (none in the simulator)."""
    idle_fraction: float = DEFAULT_IDLE_FRACTION
    settle_s: float = DEFAULT_SETTLE_S
