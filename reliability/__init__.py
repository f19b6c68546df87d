"""The reliability harness: fault scenarios against real controllers, cgroups and jobs.

Test harness and benchmark, not product: the tests import it and ``python -m
reliability.bench`` runs it longer and counts. It is not packaged in the wheel
(pyproject's package list names only adloader, controller, launcher,
throughput_model and bench).
"""
