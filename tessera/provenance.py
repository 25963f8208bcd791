"""Old home of the provenance contract, kept while callers move to ``tessera.contracts.provenance``
(tests/test_cli_stumbles.py); nothing is defined here."""

from tessera.contracts.provenance import FINGERPRINT_HEX, Provenance, fingerprint, of_file, planner_provenance

__all__ = ["FINGERPRINT_HEX", "Provenance", "fingerprint", "of_file", "planner_provenance"]
