"""``adloader.DataLoader``: torch's DataLoader, with workers that can be resized while an epoch runs.

It subclasses :class:`torch.utils.data.DataLoader`, so torch validates the
arguments exactly as it always does, ``len()``, ``sampler``, ``batch_sampler``
and the other attributes are torch's, and ``isinstance(loader,
torch.utils.data.DataLoader)`` holds for frameworks that check it. Only the
iteration is ours (see iterator.py and dispatcher.py). Differences from
torch's loader are listed in docs/dataloader.md.

A loader this one cannot run (an option it does not support, or a subclass that builds its
own iterator or never calls this ``__init__``) runs *as torch's*: torch's ``__init__`` and
``__iter__``, no reports, no resizes. Built directly that is an :class:`UnsupportedOption`
error; under ``adloader run``'s substitution (adloader.autoload), where the program asked for
torch's loader, it is a fallback with one :class:`TorchLoaderFallback` warning per process,
and the reason is recorded for the job's reports (adloader.unmanaged).
"""
from __future__ import annotations

import contextlib
import functools
import multiprocessing
import operator
import threading
import warnings
import weakref
from multiprocessing.context import BaseContext
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.utils.data
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory

from adloader import reporter, unmanaged
from adloader.dataloader.dispatcher import Pool
from adloader.dataloader.errors import BadLoaderState, BadWorkerCount, TorchLoaderFallback, UnsupportedOption
from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.iterator import LoaderIterator, LocalLoading, Source
from adloader.dataloader.seeding import draw_base_seed, isolated_global_rng
from adloader.dataloader.stats import LoaderCounters, StepEvents, StepTimer, make_step_timer
from adloader.dataloader.table import Epoch

MAX_WORKERS = 1024
STATE_VERSION = 1
_IN_EPOCH_KEYS = ("epoch", "base_seed", "position", "yielded", "rng_state", "streams")

T_co = TypeVar("T_co", covariant=True)
TorchDataLoader = torch.utils.data.DataLoader
"""torch's own loader (``torch.utils.data.DataLoader`` may be ours once substituted)."""
_fallback = False


def fall_back_when_unsupported() -> None:
    """From now on, in this process, a loader this class cannot run runs as torch's (with one
    warning) instead of raising: the substitution's mode, where the program asked for torch's loader."""
    global _fallback
    _fallback = True


class DataLoader(TorchDataLoader[T_co]):
    """Drop-in for :class:`torch.utils.data.DataLoader` whose worker count can change mid-epoch.

    ``set_num_workers(n)`` (any thread, takes effect within a second) resizes
    the pool; every batch is still delivered exactly once, in the sampler's
    order. A worker that dies has its batches re-sent to the others. Each batch
    is seeded on its own (see seeding.py), so the samples do not depend on
    which worker loaded them. ``state_dict()``/``load_state_dict()`` resume
    mid-epoch at the next unseen batch."""

    proc_root = "/proc"  # where workers read their I/O counters; tests may point it elsewhere
    step_events: StepEvents | None = None  # the step timer's device markers (None: CUDA's); bench.gpu may emulate
    _class_runs_as_torch: str | None = None  # set on subclasses that build their own iterator

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls._get_iterator is not TorchDataLoader._get_iterator:
            cls._class_runs_as_torch = f"{cls.__qualname__} builds its own iterator (_get_iterator)"

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | BaseContext | None = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        reason = self._class_runs_as_torch or unsupported_reason(dataset, prefetch_factor, in_order)
        if reason is not None and not (_fallback or self._class_runs_as_torch):
            raise UnsupportedOption(reason)
        self.__dict__["_target"] = num_workers  # torch's __init__ assigns num_workers through our property
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last,
            timeout, worker_init_fn, multiprocessing_context, generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, pin_memory_device=pin_memory_device, in_order=in_order,
        )
        if reason is not None:
            self._run_as_torch(reason, stacklevel=3)
            return
        self._prefetch = prefetch_factor if prefetch_factor is not None else 2
        self._lock = threading.Lock()
        self._applying = threading.Lock()  # see _apply_target
        self._pool: Pool | None = None  # persistent workers only
        self._iterators: weakref.WeakSet[LoaderIterator] = weakref.WeakSet()
        self._current: weakref.ref[LoaderIterator] | None = None
        self._epochs_started = 0
        self._persistent_base_seed: int | None = None
        self._resume: dict[str, Any] | None = None
        self._timer: StepTimer | None = None
        self._pin_warned = False
        self.counters = LoaderCounters()
        self._latencies: list[float] = []
        self.__dict__["_initialised"] = True
        reporter.attach(self)

    def _run_as_torch(self, reason: str, stacklevel: int) -> None:
        """Mark this loader as running as torch's; the first in the process warns, saying why."""
        self.__dict__["_runs_as_torch"] = reason
        first = unmanaged.note_unmanaged(reason)
        reporter.attach_unmanaged()
        if first:
            warnings.warn(f"adloader: this DataLoader runs as torch's, unmanaged: {reason}", TorchLoaderFallback,
                          stacklevel=stacklevel)

    @property
    def unmanaged_reason(self) -> str | None:
        """Why this loader runs as torch's (not resized, not reporting); None when it is adloader's."""
        if "_initialised" in self.__dict__:
            return None
        return self.__dict__.get("_runs_as_torch") or f"{type(self).__qualname__} does not call DataLoader.__init__"

    # ------------------------------------------------------------ resizing

    @property
    def num_workers(self) -> int:  # type: ignore[override]
        """The worker count this loader is set to (what ``set_num_workers`` last asked for)."""
        return self.__dict__["_target"]

    @num_workers.setter
    def num_workers(self, n: int) -> None:
        if self.__dict__.get("_initialised"):
            self.set_num_workers(n)
            return
        if "_target" not in self.__dict__ and "_runs_as_torch" not in self.__dict__:
            # every loader's __init__ sets num_workers (through torch's __setattr__: stacklevel 5 is its
            # caller); ours sets _target first, so this one skips ours
            self._run_as_torch(f"{type(self).__qualname__} does not call DataLoader.__init__", stacklevel=5)
        self.__dict__["_target"] = n

    def set_num_workers(self, n: int) -> None:
        """Use ``n`` workers from now on (0: load in the training process). Live for map-style
        datasets; for an IterableDataset it applies from the next epoch. Callable from any thread."""
        try:
            n = operator.index(n)
        except TypeError:
            raise BadWorkerCount(f"num_workers must be an integer, got {type(n).__name__}") from None
        if not 0 <= n <= MAX_WORKERS:
            raise BadWorkerCount(f"num_workers must be between 0 and {MAX_WORKERS}, got {n}")
        if self.unmanaged_reason is not None:
            self.__dict__["_target"] = n  # torch's loader takes it at the next iter()
            return
        with self._lock:
            self.__dict__["_target"] = n
        self._apply_target()

    def _apply_target(self) -> None:
        """Bring the workers of every live iteration (and the persistent pool) to the current target.

        Serialised, and the target is read inside: two callers cannot apply their targets in the
        reverse order they set them, so the last target set is the last applied. ``__iter__`` calls
        it once its iterator is registered, for a target set while its workers were being started."""
        with self._applying:
            with self._lock:
                n = self.__dict__["_target"]
                pool = self._pool
                iterators = [it for it in self._iterators if not it.finished]
            if pool is not None:
                pool.set_target(n)
            for iterator in iterators:
                iterator.set_target(n)

    def running_workers(self) -> int:
        """Workers ready for batches right now, over this loader's live iterations."""
        return sum(source.running() for source in self._sources())

    def worker_pids(self) -> list[int]:
        """Pids of this loader's worker processes (for diagnostics and tests)."""
        return sorted({pid for source in self._sources() for pid in source.worker_pids()})

    def loader_pids(self) -> list[int]:
        """Pids of every process this loader loads in: its workers and the helpers that fork them
        (the controller keeps these, and nothing else of the rank's, in the job's CPU group)."""
        pids = {pid for source in self._sources() for pid in source.worker_pids()}
        pids.update(pid for source in self._sources() if (pid := source.spawner_pid()) is not None)
        return sorted(pids)

    def settle_step_timing(self) -> None:
        """Count in ``counters`` every step whose device markers are recorded, waiting for the device
        to reach them (the end of a measurement: it synchronises, so never call it per step)."""
        if self._timer is not None:
            self._timer.settle()

    def resize_latencies(self) -> list[float]:
        """Seconds from each ``set_num_workers`` that added a worker to that worker's first batch."""
        return list(self._latencies)

    def close(self) -> None:
        """Stop every worker now (persistent ones included). Iterating again starts new ones."""
        if self.unmanaged_reason is not None:
            self._iterator = None  # torch's persistent iterator, if any: its workers stop when it goes
            return
        with self._lock:
            pool, self._pool = self._pool, None
            iterators = list(self._iterators)
        for iterator in iterators:
            iterator.close()
        if pool is not None:
            pool.close()

    def __del__(self) -> None:
        try:
            if self.__dict__.get("_pool") is not None:
                self._pool.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> LoaderIterator:  # type: ignore[override]
        if self.unmanaged_reason is not None:
            return TorchDataLoader.__iter__(self)
        if self._timer is None:
            self._timer = make_step_timer(self.counters, self.step_events)
        resume, self._resume = self._resume, None
        if resume is not None:
            epoch, snapshot = self._resumed_epoch(resume)
            replay_until = resume["position"] if epoch.iterable else 0
            yielded = resume["yielded"]
        else:
            epoch, snapshot = self._fresh_epoch()
            replay_until = yielded = 0
        source, owns = self._source_for(epoch)
        iterator = LoaderIterator(
            epoch=epoch, source=source, owns_source=owns, spec=self._fetch_spec(), counters=self.counters,
            timer=self._timer, timeout=self.timeout, length=lambda: len(self._index_sampler), pin=self._pinner(),
            make_pool=functools.partial(self._handover_pool, epoch.base_seed), rng_snapshot=snapshot,
            replay_until=replay_until, yielded=yielded, reported_length=self._IterableDataset_len_called,
        )
        with self._lock:
            self._iterators.add(iterator)
            self._current = weakref.ref(iterator)
        self._apply_target()  # a target set since _source_for read it reached neither the source nor this iterator
        return iterator

    def _fresh_epoch(self) -> tuple[Epoch, torch.Tensor]:
        number = self._epochs_started
        self._epochs_started += 1
        sampler_iter = None if self._iterable else iter(self._index_sampler)  # before the seed draw, as torch
        if self.persistent_workers and self._persistent_base_seed is not None:
            base_seed = self._persistent_base_seed  # torch draws it once for persistent workers
        else:
            base_seed = draw_base_seed(self.generator)
            if self.persistent_workers:
                self._persistent_base_seed = base_seed
        snapshot = self._rng_state()
        epoch = self._epoch(number, base_seed, sampler_iter)
        if self.num_workers > 0 and not epoch.iterable:
            self._prefetch_first(epoch)  # torch pulls from the sampler at iter() when it has workers
        return epoch, snapshot

    def _resumed_epoch(self, state: dict[str, Any]) -> tuple[Epoch, torch.Tensor]:
        """Rebuild the saved epoch: same base seed, sampler replayed from the saved RNG state."""
        number, position = state["epoch"], state["position"]
        self._epochs_started = number + 1
        if self._iterable:
            self.__dict__["_target"] = state["streams"]  # the same shards as when it was saved
        with self._rng_restored(state["rng_state"]):
            epoch = self._epoch(number, state["base_seed"], None if self._iterable else iter(self._index_sampler))
            if not epoch.iterable:
                for _ in range(position):
                    if epoch.pull() is None:
                        raise BadLoaderState(
                            f"the saved state is at batch {position} but the sampler now has only {epoch.pulled} "
                            "batches: was the dataset, sampler or batch size changed?"
                        )
                epoch.batches.clear()
                epoch.next_to_yield = position
                self._prefetch_first(epoch)
        return epoch, state["rng_state"]

    def _epoch(self, number: int, base_seed: int, sampler_iter: Iterator[Any] | None) -> Epoch:
        return Epoch(
            number=number, base_seed=base_seed, source=sampler_iter,
            iterable_batch_size=self.batch_size if self._auto_collation else None,
        )

    @staticmethod
    def _prefetch_first(epoch: Epoch) -> None:
        batch = epoch.pull()
        if batch is not None:
            epoch.requeue(batch)

    def _source_for(self, epoch: Epoch) -> tuple[Source, bool]:
        """(source, owned by the iterator). Workers start here, in the thread that calls iter()."""
        wants_pool = self.num_workers > 0 or reporter.is_managed()
        if self.persistent_workers:
            with self._lock:
                if self._pool is None and wants_pool:
                    self._pool = self._new_pool(self.num_workers, epoch.base_seed)
                return (self._pool or LocalLoading()), self._pool is None
        if wants_pool:
            return self._new_pool(self.num_workers, epoch.base_seed), True
        return LocalLoading(), True

    def _handover_pool(self, base_seed: int, n: int) -> tuple[Pool, bool]:
        """(a Pool for an epoch that started with no workers and is now given some, owned by the
        epoch's iterator). A persistent loader keeps it for its next epochs: the epoch's end must
        not close it."""
        pool = self._new_pool(n, base_seed)
        if self.persistent_workers:
            with self._lock:
                if self._pool is None:
                    self._pool = pool
                    return pool, False
        return pool, True

    def _new_pool(self, n: int, base_seed: int) -> Pool:
        return Pool(
            spec=self._fetch_spec(), context=self._context(), target=n, prefetch_factor=self._prefetch,
            base_seed=base_seed, counters=self.counters, latencies=self._latencies, pin=self._pinner(), proc_root=self.proc_root,
        )

    def _sources(self) -> list[Source]:
        if self.unmanaged_reason is not None:
            return []
        with self._lock:
            sources = [it.source for it in self._iterators if not it.finished]
            if self._pool is not None:
                sources.append(self._pool)
        unique: dict[int, Source] = {id(s): s for s in sources}
        return list(unique.values())

    @property
    def _iterable(self) -> bool:
        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    def _fetch_spec(self) -> FetchSpec:
        return FetchSpec(
            dataset=self.dataset, iterable=self._iterable, auto_collation=self._auto_collation,
            collate_fn=self.collate_fn, drop_last=self.drop_last, worker_init_fn=self.worker_init_fn,
        )

    def _context(self) -> BaseContext:
        return self.multiprocessing_context or multiprocessing.get_context()

    def _pinner(self) -> Callable[[Any], Any] | None:
        """torch's pin-memory step for the current accelerator, or None (with torch's warning)."""
        if not self.pin_memory:
            return None
        accelerator = getattr(torch, "accelerator", None)
        device = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
        if device is None or device.type == "mps":
            if not self._pin_warned:
                self._pin_warned = True
                warnings.warn(
                    "'pin_memory' argument is set as true but no accelerator that supports it is found, "
                    "then device pinned memory won't be used.", stacklevel=3,
                )
            return None
        return functools.partial(_pin_on, device.type, accelerator.current_device_index())

    # ------------------------------------------------------------ checkpointing (torchdata's Stateful protocol)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: resuming from it yields exactly the batches not yet delivered.
        Empty for a loader that runs as torch's (it keeps no position, as torch's)."""
        if self.unmanaged_reason is not None:
            return {}
        with self._lock:
            iterator = self._current() if self._current is not None else None
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "epochs_started": self._epochs_started,
            "persistent_base_seed": self._persistent_base_seed,
            "generator_state": self.generator.get_state() if self.generator is not None else None,
            "in_epoch": iterator is not None and not iterator.finished,
        }
        if state["in_epoch"]:
            epoch = iterator.epoch
            state.update(
                epoch=epoch.number, base_seed=epoch.base_seed, yielded=iterator.yielded,
                position=max(epoch.next_to_yield, iterator.replay_until), rng_state=iterator.rng_snapshot,
                streams=epoch.streams,
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` continues where the saved one stopped.
        A loader that runs as torch's takes only the empty state it saves."""
        if self.unmanaged_reason is not None and state == {}:
            return
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise BadLoaderState(
                f"expected a state from adloader.DataLoader.state_dict() (version {STATE_VERSION}), "
                f"got {type(state).__name__} with version {getattr(state, 'get', lambda _: None)('version')!r}"
            )
        missing = [k for k in ("epochs_started", "in_epoch") if k not in state]
        if state.get("in_epoch"):
            missing += [k for k in _IN_EPOCH_KEYS if k not in state]
        if missing:
            raise BadLoaderState(f"the saved loader state lacks {missing}; was it written by another program?")
        self._epochs_started = state["epochs_started"]
        self._persistent_base_seed = state.get("persistent_base_seed")
        if state["in_epoch"]:
            self._resume = dict(state)
        else:
            self._resume = None
            if self.generator is not None and state.get("generator_state") is not None:
                self.generator.set_state(state["generator_state"])

    def _rng_state(self) -> torch.Tensor:
        return self.generator.get_state() if self.generator is not None else torch.get_rng_state()

    @contextlib.contextmanager
    def _rng_restored(self, snapshot: torch.Tensor) -> Iterator[None]:
        """The RNG the sampler draws from, set back to ``snapshot``. torch's global RNG is restored
        afterwards: it belongs to the training script, which restores its own."""
        if self.generator is not None:
            self.generator.set_state(snapshot)
            yield
            return
        with isolated_global_rng():
            torch.set_rng_state(snapshot)
            yield


def _pin_on(device_type: str, device_index: int, data: Any) -> Any:
    torch.accelerator.set_device_index(device_index)  # thread-local: the dispatcher thread pins too
    return torch_pin_memory(data, device_type)


def unsupported_reason(dataset: Any, prefetch_factor: int | None, in_order: bool) -> str | None:
    """Why adloader's loader cannot run these arguments (what to do instead), or None."""
    if not in_order:
        return ("in_order=False is not supported: adloader.DataLoader always delivers batches in the sampler's "
                "order (its exactly-once, resumable delivery depends on it); drop the argument")
    if prefetch_factor == 0:
        return "prefetch_factor=0 would never send a worker any work; use 1 or more (or None)"
    datapipes = tuple(
        cls for cls in (getattr(torch.utils.data, n, None) for n in ("IterDataPipe", "MapDataPipe")) if cls
    )
    if datapipes and isinstance(dataset, datapipes):
        return "DataPipes (deprecated in torch) are not supported; wrap the pipe in a Dataset or IterableDataset"
    return None
