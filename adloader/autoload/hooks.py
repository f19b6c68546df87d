"""Post-import hooks: run a function once a module has finished importing, without importing it.

:func:`when_imported` runs the callback at once when the module is already imported, else
right after its first import completes (before the importer gets it back). A finder at the
front of ``sys.meta_path`` notices the import, lets the other finders find the module, and
wraps its loader for that one import; the module's ``__loader__`` and ``__spec__.loader``
are the original ones afterwards. A callback that raises is logged and never breaks the
program's import. A module that is half imported when a callback is registered (the
registration happens during its own import) gets the callback only if imported again.
"""
from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # start-up stays cheap: every process of a managed job imports this module
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Callable, Sequence

    Callback = Callable[[ModuleType], None]


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module ``name`` has finished importing: now if it has."""
    module = sys.modules.get(name)
    if module is not None and not initializing(module):
        _call(name, callback, module)
        return
    _finder().add(name, callback)


def initializing(module: ModuleType) -> bool:
    """The module's import is under way (it is in ``sys.modules``, half run)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _call(name: str, callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception:  # noqa: BLE001 - a hook must never break the program's import
        import logging

        logging.getLogger(__name__).warning(
            "adloader: the hook run after importing %s failed; the program goes on without it", name, exc_info=True)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, wraps the loader the other finders return."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[str, list[Callback]] = {}

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self._callbacks:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, self._fire)
                return spec
        return None

    def _fire(self, module: ModuleType) -> None:
        with self._lock:
            callbacks = self._callbacks.pop(module.__name__, [])
        for callback in callbacks:
            _call(module.__name__, callback, module)


class _NotifyingLoader(importlib.abc.Loader):
    """The module's own loader, plus the callbacks once its code has run."""

    def __init__(self, loader: Any, fire: Callback) -> None:
        self._loader = loader
        self._fire = fire

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None and module.__spec__.loader is self:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


_installed: PostImportFinder | None = None
_install_lock = threading.Lock()


def _finder() -> PostImportFinder:
    """This process's finder, put at the front of ``sys.meta_path`` on first use."""
    global _installed
    with _install_lock:
        if _installed is None or _installed not in sys.meta_path:
            _installed = PostImportFinder()
            sys.meta_path.insert(0, _installed)
        return _installed
