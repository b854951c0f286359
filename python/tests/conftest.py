# Lets `python -m pytest python/tests` import the threadheap package from the source tree without
# PYTHONPATH.
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture
def no_protobuf_pythonpath(tmp_path):
    """A PYTHONPATH under which `import google.protobuf` fails, with the source tree's package after it."""
    site = tmp_path / "site"
    (site / "google" / "protobuf").mkdir(parents=True)
    (site / "google" / "__init__.py").write_text("")
    (site / "google" / "protobuf" / "__init__.py").write_text("raise ImportError('No module named protobuf')\n")
    return f"{site}:{Path(__file__).resolve().parents[1]}"
