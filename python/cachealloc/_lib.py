"""Loading libcachealloc.so with ctypes, and the prototype of every function
of its C header (capi/include/cachealloc.h).

The library is looked for, in order:

1. next to this file (the copy a wheel ships);
2. ``$CACHEALLOC_LIB`` (a path to a built ``libcachealloc.so``);
3. ``target/release`` then ``target/debug`` of the source checkout this
   package sits in (``python/cachealloc`` of the cachealloc repository).

Every function of the header is declared with its C types (``_prototypes.py``,
generated from the header), so a wrong call raises ``ctypes.ArgumentError``
instead of corrupting memory.
"""

import ctypes
import os
import threading
from ctypes import c_void_p

# The structures this package mirrors, and every function's prototype and
# callback type, generated from the header (``_prototypes.py``).
from ._prototypes import (  # noqa: F401
    CACHEALLOC_ERROR_OTHER,
    CACHEALLOC_ERROR_OUT_OF_MEMORY,
    CACHEALLOC_OK,
    DEBUG_PROTOTYPES,
    OOM_CAUSE_OBSERVER,
    OOM_OBSERVER,
    POOL_STATS_CALLBACK,
    PROTOTYPES,
    STAT_CALLBACK,
)
from ._structs import Fragmentation, IpcHandle, OomCause, PoolMemory  # noqa: F401

LIBRARY_NAME = "libcachealloc.so"


class CacheallocError(RuntimeError):
    """A call into libcachealloc failed; the message is ``cachealloc_last_error()``."""


class OutOfMemoryError(CacheallocError):
    """An allocation found no room on the device (or under its memory
    fraction): the library's ``CACHEALLOC_ERROR_OUT_OF_MEMORY``, PyTorch's
    "CUDA out of memory" (which torch raises as ``torch.OutOfMemoryError``).
    The message is the library's."""


#: ``cachealloc_last_error_code()``: the last call succeeded.
OK = CACHEALLOC_OK
#: ``cachealloc_last_error_code()``: the last call ran out of memory.
ERROR_OUT_OF_MEMORY = CACHEALLOC_ERROR_OUT_OF_MEMORY
#: ``cachealloc_last_error_code()``: the last call failed otherwise (the
#: header's other codes, ``_prototypes.CACHEALLOC_ERROR_*``, say how).
ERROR_OTHER = CACHEALLOC_ERROR_OTHER


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)
    given = os.environ.get("CACHEALLOC_LIB")
    if given:
        yield os.path.abspath(given)
    root = os.path.dirname(os.path.dirname(here))
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target")
    for profile in ("release", "debug"):
        yield os.path.join(target, profile, LIBRARY_NAME)


def library_path():
    """The absolute path of the libcachealloc.so this package uses (the one
    ``torch.cuda.memory.CUDAPluggableAllocator`` is given by ``install()``)."""
    tried = []
    for path in _candidates():
        if os.path.isfile(path):
            return path
        tried.append(path)
    raise OSError(
        "cachealloc: %s not found (looked at: %s). Install the cachealloc wheel, "
        "or build it with `cargo build --release -p cachealloc-capi` and set "
        "CACHEALLOC_LIB to its path." % (LIBRARY_NAME, ", ".join(tried))
    )


_LOCK = threading.Lock()
_LIB = None


def lib():
    """The loaded library (a ``ctypes.CDLL``, every prototype declared),
    loaded at the first call."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                loaded = ctypes.CDLL(library_path())
                for name, (restype, argtypes) in PROTOTYPES.items():
                    fn = getattr(loaded, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
                for name, (restype, argtypes) in DEBUG_PROTOTYPES.items():
                    fn = getattr(loaded, name, None)
                    if fn is not None:
                        fn.restype = restype
                        fn.argtypes = argtypes
                _LIB = loaded
    return _LIB


def has_debug_hooks():
    """Whether the loaded library has the test hooks (feature debug-hooks;
    a released library has none)."""
    return hasattr(lib(), "cachealloc_debug_force_internal_error")


def address(name):
    """The address of exported function ``name``, as PyTorch takes it
    (``ctypes.cast(getattr(lib, name), ctypes.c_void_p).value``)."""
    value = ctypes.cast(getattr(lib(), name), c_void_p).value
    if not value:
        raise CacheallocError("cachealloc: %s has no address" % name)
    return value


def last_error():
    """The message of the last failed call on this thread, or None."""
    msg = lib().cachealloc_last_error()
    return None if msg is None else msg.decode("utf-8", "replace")


def last_error_code():
    """The kind of the last failed call on this thread: ``ERROR_OUT_OF_MEMORY``,
    ``ERROR_OTHER``, or ``OK`` (0) when it succeeded."""
    return lib().cachealloc_last_error_code()


def error(message):
    """The exception for the last failed call on this thread, with
    ``message``: an ``OutOfMemoryError`` if the library says it ran out of
    memory, else a ``CacheallocError``."""
    kind = OutOfMemoryError if last_error_code() == ERROR_OUT_OF_MEMORY else CacheallocError
    return kind(message)


def fail(what):
    """The exception for a failed call (``error``), with the library's message."""
    msg = last_error()
    return error("%s failed: %s" % (what, msg or "no message from the library"))


def check(status, what):
    """Raise for a nonzero status; ``what`` names the call."""
    if status != 0:
        raise fail(what)


def check_void(what):
    """Raise if the void call just made on this thread left an error."""
    msg = last_error()
    if msg is not None:
        raise error("%s failed: %s" % (what, msg))


def version():
    """The C library's version, e.g. ``"0.1.0"``."""
    return lib().cachealloc_version().decode("ascii")


def backend():
    """The kind of device the library runs on: ``"cuda"``, ``"hip"`` or
    ``"mock"`` (``CACHEALLOC_BACKEND``; unset or ``auto``, the GPU that is
    present). Raises when the settings are wrong or no GPU was found."""
    name = lib().cachealloc_backend()
    if name is None:
        raise fail("cachealloc_backend")
    return name.decode("ascii")
