"""servetune's dashboards and static report, built on :mod:`analysis`.

``panel serve dashboards/`` runs the dashboard (``dashboards/main.py``); Bokeh executes this file
first when it serves the folder, so it imports nothing. ``python -m dashboards report EXPERIMENT
--out report.html`` writes the offline HTML report (:mod:`dashboards.report`).
"""
