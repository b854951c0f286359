"""threadheap's command-line tools: `threadheap bench`, `threadheap run` and `threadheap top`.

Only the standard library is imported at package level; the bench module keeps its third-party imports
(rich, matplotlib) inside the functions that need them.
"""

__version__ = "0.1.0"
