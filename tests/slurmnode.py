"""The `slurm` fixture: a real one-node Slurm per test worker, started by the very recipe
users run (contrib/slurm/onenode.py), in a temporary directory on free ports, so that
parallel workers never share a controller. It skips, with the reason, where the packages
are missing or we are not root (slurmd must run jobs as their users)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "contrib" / "slurm"))
from onenode import PACKAGES, SlurmNode, unavailable_reason  # noqa: F401 - for the tests


@pytest.fixture(scope="session")
def slurm():
    """A running one-node Slurm for this worker, stopped at the end of the session."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="gpusched-slurm-"))
    node = SlurmNode(base)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
