"""Give large message buffers back to the operating system when they are freed.

glibc serves an allocation of at least M_MMAP_THRESHOLD bytes with its own mmap,
unmapped again by free(). But the threshold is dynamic: freeing such a block
raises it to that block's size (up to 32 MiB), so after the first large message
every later one of that size comes from the heap, whose freed memory glibc keeps.
A router holding a few GB of large messages for a stuck subscriber then stays at
that size for ever after they finished (issue 16, part 4). Setting the threshold
once fixes it where it is (and turns the dynamic adjustment off), so every large
payload, in Python bytes or proton's buffers, is its own mapping again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("eorouter.malloc")

M_MMAP_THRESHOLD = -3  # <malloc.h>
THRESHOLD = 128 * 1024  # glibc's initial value: buffers this large or larger are mapped


def return_large_buffers_to_the_os(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold; False (and nothing changed) without glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt): its own policy stands
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1
    if not ok:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) failed: freed large messages may stay in the heap", threshold)
    return ok
