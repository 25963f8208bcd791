"""The four coarse alternatives Tessera is compared with, one module each (docs/plan.md "Strategies"):

  homogeneous      independent replicas per GPU type in their best group (tensor parallel, or for a MoE
                   model data-parallel attention with the experts split by expert or by dimension);
  prefill_decode   DistServe on a pair, rate-matched, KV over the link;
  attention_ffn    MegaScale-Infer: attention + KV on one device, FFN / experts on the other;
  layer_pipeline   contiguous layer ranges, the split searched by memory and speed, asynchronous
                   micro-batches.

Each module's ``rule`` (attention_ffn, layer_pipeline) maps (graph, batch, m) to a kernel assignment;
``homogeneous`` and ``prefill_decode`` score their own deployments with the same serving model.
"""

from tessera.plan.baselines.attention_ffn import (
           attention_ffn,
           attention_sides,
           has_attention,
           is_attention_kernel,
)
from tessera.plan.baselines.layer_pipeline import layer_pipeline, layer_ranges, layer_seconds

__all__ = ["attention_ffn", "attention_sides", "has_attention", "is_attention_kernel", "layer_pipeline",
           "layer_ranges", "layer_seconds"]
