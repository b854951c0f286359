# Lets `python -m pytest python/tests` import the threadheap package from the source tree without
# PYTHONPATH.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
