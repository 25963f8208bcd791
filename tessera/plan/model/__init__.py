"""The serving model every plan is scored under (docs/plan.md "The serving model"):

  shapes   one serving iteration's shape, and a micro-batch's kernel graph at any shape from one capture;
  units    groups of GPUs (tensor parallel, data-parallel attention) as placement devices, their costs;
  knee     goodput in closed form: the SLO knee of a continuous-batching engine from its step costs;
  serving  iterations under a token budget, asynchronous micro-batches, memory, a point's score and the
           batch × micro-batch search;
  cell     one cell's search shared by every strategy, and the Plan file it yields.

It uses the solver's verifier to time a placement; the solver does not import it.
"""
