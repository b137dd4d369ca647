"""A gpusched home whose real daemon reads fake GPUs through the real NVML backend."""

from __future__ import annotations

import pickle
from pathlib import Path

from conftest import REPO, Home
from fake_nvml import FakeDriver

SITE = Path(__file__).parent / "fakenvml_site"


def nvml_home(make_home, tmp_path: Path, driver: FakeDriver, name: str = "nvml") -> Home:
    """A home (cleaned up by make_home) on `driver`'s GPUs; its daemon is not started yet."""
    home = make_home("", name=name)
    driver_file = tmp_path / f"{name}-driver.pickle"
    driver_file.write_bytes(pickle.dumps(driver))
    home.env.update(GPUSCHED_TEST_FAKE_NVML=str(driver_file), PYTHONPATH=f"{SITE}:{REPO}")
    return home
