"""Kernel placement as a MILP (docs/plan.md "The placement MILP"):

  problem   one phase's placement problem from a KernelGraph, a pool and a cost model;
  highs     a named-model builder over HiGHS;
  milp      the flat MILP (throughput and latency objectives) and its LP bound;
  patterns  repeated layers as a few patterns per segment with integer counts;
  solve     one phase solved (patterns and polish, or the flat MILP) and checked;
  bound     the joint LP bound of a multi-phase plan, and the floors the search prunes with;
  verify    the independent verifier: an assignment's loads, transfers, memory and latency recomputed.

It imports nothing from the serving model above it.
"""
