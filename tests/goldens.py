"""Golden files: text a test renders, compared with the copy under tests/golden/."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("GPUSCHED_UPDATE_GOLDEN") == "1"


def check_golden(name: str, text: str) -> None:
    """Fail with a diff when `text` differs from tests/golden/NAME; GPUSCHED_UPDATE_GOLDEN=1
    rewrites the file instead (after a deliberate change: read the diff first)."""
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"wrote {path}")
    assert path.exists(), f"{path} is missing; GPUSCHED_UPDATE_GOLDEN=1 pytest makes it"
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True),
                text.splitlines(True),
                f"{name} (expected)",
                f"{name} (rendered)",
            )
        )
        pytest.fail(
            f"output differs from {path} (GPUSCHED_UPDATE_GOLDEN=1 rewrites it after "
            f"a deliberate change):\n{diff}",
            pytrace=False,
        )
