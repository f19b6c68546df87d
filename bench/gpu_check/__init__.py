"""The parts of ``python -m bench.gpu``: the one prepared run that proves adloader's GPU path.

Each module measures one thing on a :class:`bench.gpu_check.device.CheckDevice` (a CUDA GPU,
or on a machine without one the emulated device of ``--dry-run``); bench/gpu.py runs them
within their time budgets and writes what they found (docs/gpu.md).
"""
