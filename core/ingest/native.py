"""The native scanner (core/ingest/_fastscan.c) when it was built at install, else None.

The build is optional (no C compiler: pure Python, same results, slower on big logs); every
user imports it from here, so there is one place that decides.
"""

try:
    from tunedeck.core.ingest import _fastscan as fastscan
except ImportError:
    fastscan = None
