"""Predicts each kernel's time on each GPU type."""

from tessera.cost.model import CostModel, Efficiency

__all__ = ["CostModel", "Efficiency"]
