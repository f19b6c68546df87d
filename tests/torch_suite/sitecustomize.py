"""The substitution shim for running PyTorch's own test/test_dataloader.py on adloader's loader.

On PYTHONPATH with ``ADLOADER_SUBSTITUTE=1`` (tests/torch_suite/run.py sets both), Python imports this
at start-up in every process, including the spawn/forkserver children the tests start, and replaces
``torch.utils.data.DataLoader`` (and ``torch.utils.data.dataloader.DataLoader``) with
``adloader.DataLoader`` before any test module imports it. Without the variable it does nothing.
"""
import os

if os.environ.get("ADLOADER_SUBSTITUTE") == "1":
    import torch.utils.data
    import torch.utils.data.dataloader

    from adloader import DataLoader

    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader
