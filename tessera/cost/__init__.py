"""Predicts each kernel's time on each GPU type."""

from tessera.cost.calibrate import default_cost_model
from tessera.cost.model import CostModel, Efficiency

__all__ = ["CostModel", "Efficiency", "default_cost_model"]
