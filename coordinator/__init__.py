"""The coordinator: validates experiments, plans trials, leases batches to daemons, stores results.

Entry point: ``python -m coordinator {validate,sweep} ...``.
"""
