"""pytest configuration of the pagedkv suite: the helpers' import path and the
`heavy` marker (tests that take long or need large downloads; select them with
`-m heavy`, leave them out with `-m "not heavy"`)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "heavy: slow or needs large downloads (torch, models)")
