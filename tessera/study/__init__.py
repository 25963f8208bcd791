"""The experiments, on the top floor: `tessera compare` (the compare matrix), `tessera evaluate` (the
evaluation study) and `make demo` plan, simulate and aggregate many cells and write the JSON and markdown
that `tessera report` renders. Nothing below imports this package."""
