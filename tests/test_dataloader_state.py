"""torchdata's Stateful protocol: a state saved mid-epoch, while the pool is being resized, resumes in a
loader with another worker count at the next unseen batch; and the two state formats are not
interchangeable (each side refuses the other's state with an error, nothing is silently misread)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from adloader import DataLoader
from adloader.dataloader import BadLoaderState

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
needs_torchdata = pytest.mark.skipif(importlib.util.find_spec("torchdata") is None,
                                     reason="torchdata is not installed (./install.sh --test installs it)")


def batches(loader) -> list[list[int]]:
    return [b.tolist() for b in loader]


def test_a_state_saved_during_a_resize_resumes_with_another_worker_count() -> None:
    expected = batches(torch.utils.data.DataLoader(range(40), batch_size=2, shuffle=True,
                                                   generator=torch.Generator().manual_seed(3)))
    first = DataLoader(range(40), batch_size=2, shuffle=True, num_workers=1, generator=torch.Generator().manual_seed(3))
    seen = []
    for step, batch in enumerate(first):
        seen.append(batch.tolist())
        if step == 3:
            first.set_num_workers(3)  # the state is taken while the pool grows
        if step == 5:
            state = first.state_dict()
            break
    first.close()
    resumed = DataLoader(range(40), batch_size=2, shuffle=True, num_workers=2,
                         generator=torch.Generator().manual_seed(3))
    resumed.load_state_dict(state)
    try:
        assert seen + batches(resumed) == expected
    finally:
        resumed.close()


@needs_torchdata
def test_state_dicts_of_torchdatas_stateful_dataloader_are_not_interchangeable_with_ours() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    theirs = StatefulDataLoader(list(range(20)), batch_size=2, num_workers=1)
    iterator = iter(theirs)
    next(iterator)
    their_state = theirs.state_dict()
    with pytest.raises(BadLoaderState, match="expected a state from adloader.DataLoader"):
        DataLoader(list(range(20)), batch_size=2).load_state_dict(their_state)

    ours = DataLoader(list(range(20)), batch_size=2, num_workers=1)
    iterator = iter(ours)
    next(iterator)
    our_state = ours.state_dict()
    ours.close()
    other = StatefulDataLoader(list(range(20)), batch_size=2, num_workers=1)
    with pytest.raises(Exception):  # torchdata asserts on its own keys (_snapshot, ...)
        other.load_state_dict(our_state)
        next(iter(other))
