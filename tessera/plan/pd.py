"""Former home of prefill/decode disaggregation, kept for callers that import it from here: the baseline
lives in tessera.plan.baselines.prefill_decode."""

from tessera.plan.baselines.prefill_decode import decode_shape, kv_bytes, prefill_shape, rate_matched

__all__ = ["decode_shape", "kv_bytes", "prefill_shape", "rate_matched"]
