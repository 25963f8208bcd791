"""The report's "Deploy it" section: the commands that serve the plan (tessera.plan's launch lines, looked up
by the report's caller for the plan file it was given; PLAN.json where the report was built without one)."""

from __future__ import annotations

from html import escape

from tessera.report.data import ReportData


def deploy_html(data: ReportData) -> str:
    if data.pool is not None:
        return ("<p>A pool of different cells is deployed cell by cell: each cell's plan with its own "
                "<code>tessera serve</code>.</p>")
    if data.plan is None:
        return '<p class="note">Deploy commands omitted: no plan given.</p>'
    lines = data.deploy
    ours = [x.removeprefix("deploy with: ") for x in lines if x.startswith("deploy with: ")]
    peers = [x.strip().removeprefix("as ") for x in lines if x.startswith("  as ")]
    out = ["<p>To serve this plan with Tessera's engine (one server per replica):</p>",
           "<pre>" + escape("\n".join(ours)) + "</pre>"]
    if peers:
        out += ["<p>The answer is a layout an existing engine already runs; the same deployment there:</p>",
                "<pre>" + escape("\n".join(peers)) + "</pre>"]
    return "".join(out)
