"""Puts the fake NVML library (tests/fake_nvml.py) under the real pynvml in a daemon that
tests start, so a real daemon and the real CLI see fake GPUs through the real NVML backend.

Active only when GPUSCHED_TEST_FAKE_NVML names a pickled FakeDriver; the patch is applied
when pynvml is first imported, so processes that never import it pay nothing.
"""

import os
import sys

_DRIVER_FILE = os.environ.get("GPUSCHED_TEST_FAKE_NVML")


def _install(pynvml):
    import pickle

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fake_nvml import FakeNvmlLib

    with open(_DRIVER_FILE, "rb") as f:
        pynvml.CDLL = FakeNvmlLib(pickle.load(f)).load


if _DRIVER_FILE:
    import importlib.abc
    import importlib.util

    class _PatchPynvml(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "pynvml":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec("pynvml")
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _install(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchPynvml())
