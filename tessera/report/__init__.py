"""Report stage: terminal tables, figures and one self-contained HTML report (see docs/report.md).

Entry points: ``tessera.report.html.build_report(ReportData, out_dir)``, ``tessera.report.data`` (parsers of
the plan/compare/simulate JSON contracts), ``tessera.report.plots`` and ``tessera.report.tables``.
"""
