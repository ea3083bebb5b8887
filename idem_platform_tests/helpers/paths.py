"""Where the tests find the repository's files: the example config and the copied key vectors."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The key vectors of the design's spec, copied into the project: the tests pass from a
# clone with nothing beside it. contract/test_keys checks the copy against the shared
# original whenever a checkout has one next to it.
CASES_DIR = REPO / "idem_platform_tests" / "cases"
SPEC_DIR = CASES_DIR / "spec"
EXAMPLE_CONFIG = REPO / "examples" / "threatfeed" / "idem.yaml"


def shared_spec_dir() -> Path | None:
    """The design's ``shared/spec`` next to the checkout (``IDEM_SPEC_DIR`` overrides), if any."""
    explicit = os.environ.get("IDEM_SPEC_DIR")
    if explicit:
        return Path(explicit)
    for ancestor in REPO.parents:
        candidate = ancestor / "shared" / "spec"
        if candidate.is_dir():
            return candidate
    return None
