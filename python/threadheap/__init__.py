"""threadheap's command-line tools: `threadheap bench`, `threadheap run`, `threadheap top` and
`threadheap profile`.

Only the standard library is imported at package level; the bench module keeps its third-party imports
(rich, matplotlib) inside the functions that need them. The version is the library's (`threadheap --version`
asks it), not a copy here.
"""
