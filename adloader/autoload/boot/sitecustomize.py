"""adloader's start-up file, first on a job's PYTHONPATH (``adloader run`` puts it there).

Python imports it as ``sitecustomize`` at the start of every process of the job. In a managed
job with the substitution on (adloader/env.py), it arranges that torch's DataLoader becomes
adloader's once torch is imported (adloader.autoload), and the job's model is described at
its first optimizer step (adloader.autodescribe), then runs the environment's own
``sitecustomize``, the next one on ``sys.path`` after this directory, so a site's or a
virtualenv's start-up code still runs. It imports neither torch nor anything heavy.
"""
import importlib.machinery
import importlib.util
import os
import sys


def _start_substitution() -> None:
    try:
        from adloader import env
    except ImportError:  # this Python has no adloader: its loaders stay torch's
        return
    if env.substitution_on():
        from adloader.autoload import substitute

        substitute.install()
        substitute.describe_at_first_step()


def _chain_to_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    after = len(entries) - entries[::-1].index(here) if here in entries else 0  # past our last entry: no recursion
    rest = [p for p, absolute in zip(sys.path[after:], entries[after:]) if absolute != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start_substitution()
_chain_to_next_sitecustomize()
