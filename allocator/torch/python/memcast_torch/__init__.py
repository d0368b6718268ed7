"""memcast as PyTorch's CUDA allocator.

Two ways in (see docs/cuda.md):

- ``install()``: every CUDA allocation of the process goes to memcast
  (``CUDAPluggableAllocator`` + ``change_current_allocator``). It must run before the
  first CUDA allocation (before CUDA is initialized); later it raises ``MemcastError``.
  PyTorch's own memory statistics (``torch.cuda.memory_stats``) are unavailable then:
  use ``stats()``.
- ``pool()``: a ``torch.cuda.MemPool`` whose segments come from memcast; use it with
  ``use_pool(pool)`` (every thread's allocations, autograd's backward thread included)
  or ``torch.cuda.use_mem_pool(pool)`` (the calling thread's only). PyTorch's caching
  allocator keeps managing blocks inside those segments, so its statistics keep
  working, and it can be used any time.

Also ``stats()`` (memcast's statistics, a dict), ``step()`` (an iteration boundary),
``empty_cache()``, ``offload(blocks, budget)`` (train a larger batch than fits: keep,
offload to memcast's pinned host pool, or recompute what each block saves for backward;
docs/oversubscription.md), ``record(path)`` (the run as a ``.mctrace`` trace for ``memcast
train``/``memcast replay``), ``configure(conf)`` and ``predictive(on)``.

The library ``libmemcast_torch.so`` is found at ``$MEMCAST_TORCH_LIB``, else beside this
file, else in the repository's ``target/release`` or ``target/debug``.
"""

import contextlib
import ctypes
import json
import os
import threading

__all__ = [
    "MemcastError",
    "lib_path",
    "configure",
    "install",
    "installed",
    "pool",
    "use_pool",
    "stats",
    "step",
    "empty_cache",
    "record",
    "predictive",
    "last_error",
    "check",
    "offload",
    "PlanError",
]

_LIB_NAME = "libmemcast_torch.so"
_lock = threading.Lock()
_lib = None
_allocator = None
_installed = False
_failed_seen = {}


class MemcastError(RuntimeError):
    """A memcast call failed; the message says why."""


def lib_path():
    """Where the memcast_torch library is (see the module docs)."""
    env = os.environ.get("MEMCAST_TORCH_LIB")
    if env:
        if not os.path.isfile(env):
            raise MemcastError(f"MEMCAST_TORCH_LIB={env!r} is not a file")
        return os.path.realpath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, _LIB_NAME)]
    d = here
    for _ in range(6):
        d = os.path.dirname(d)
        for profile in ("release", "debug"):
            candidates.append(os.path.join(d, "target", profile, _LIB_NAME))
    for c in candidates:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise MemcastError(
        f"{_LIB_NAME} not found: set MEMCAST_TORCH_LIB, or build it with "
        "`cargo build --release -p memcast-torch`"
    )


def _load():
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(lib_path())
            lib.memcast_malloc.restype = ctypes.c_void_p
            lib.memcast_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            lib.memcast_free.restype = None
            lib.memcast_free.argtypes = [
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
            ]
            lib.memcast_configure.restype = ctypes.c_int
            lib.memcast_configure.argtypes = [ctypes.c_char_p]
            lib.memcast_stats.restype = ctypes.c_long
            lib.memcast_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
            lib.memcast_last_error.restype = ctypes.c_long
            lib.memcast_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            for f in ("memcast_empty_cache", "memcast_step", "memcast_record_start"):
                getattr(lib, f).restype = ctypes.c_int
                getattr(lib, f).argtypes = [ctypes.c_int]
            lib.memcast_record_stop.restype = ctypes.c_int
            lib.memcast_record_stop.argtypes = [ctypes.c_int, ctypes.c_char_p]
            lib.memcast_reset.restype = None
            lib.memcast_reset.argtypes = []
            _lib = lib
        return _lib


def _text(fn, *args):
    """A string out of a `long f(..., char* buf, size_t len)` export."""
    n = 4096
    while True:
        buf = ctypes.create_string_buffer(n)
        got = fn(*args, buf, n)
        if got < 0:
            return None
        if got < n:
            return buf.value.decode("utf-8", "replace")
        n = got + 1


def last_error():
    """The text of memcast's last error ('' if none)."""
    return _text(_load().memcast_last_error) or ""


def _check(rc, what):
    if rc != 0:
        raise MemcastError(f"{what} failed: {last_error()}")


def _device(device):
    """The CUDA device index of ``device``: None (the current device), an int, a
    ``torch.device`` or a string such as ``"cuda:1"`` (as ``torch.cuda`` takes them)."""
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"memcast manages CUDA devices, not {device}")
        return device.index if device.index is not None else torch.cuda.current_device()
    return int(device)


def check(device=None):
    """Raises ``MemcastError`` if an allocation failed on ``device`` since the last
    check. Needed after ``install()``: PyTorch 2.11 does not check the pointer a
    pluggable allocator returns, so an out-of-memory gives a tensor with a null data
    pointer and no error (a kernel using it faults). ``pool()`` has no such gap:
    PyTorch's caching allocator raises ``torch.OutOfMemoryError`` itself."""
    d = _device(device)
    failed = stats(d).get("failed_allocs", 0)
    if failed > _failed_seen.get(d, 0):
        n = failed - _failed_seen.get(d, 0)
        _failed_seen[d] = failed
        raise MemcastError(f"{n} CUDA allocation(s) failed in memcast: {last_error()}")


def configure(conf):
    """Allocator settings, ``key:value,...`` as in ``MEMCAST_ALLOC_CONF`` (applied over
    it). Only before memcast's first allocation."""
    _check(_load().memcast_configure(conf.encode()), f"configure({conf!r})")


def _custom_allocator():
    """PyTorch's handle on memcast's malloc/free (one per process)."""
    global _allocator
    import torch

    with _lock:
        if _allocator is None:
            lib = _lib
            alloc_fn = ctypes.cast(lib.memcast_malloc, ctypes.c_void_p).value
            free_fn = ctypes.cast(lib.memcast_free, ctypes.c_void_p).value
            _allocator = torch._C._cuda_customAllocator(alloc_fn, free_fn)
        return _allocator


class _Pluggable(object):
    """What ``change_current_allocator`` and ``MemPool`` take (its ``allocator()``)."""

    def __init__(self, handle):
        self._allocator = handle

    def allocator(self):
        return self._allocator


def installed():
    """Whether ``install()`` made memcast the process's CUDA allocator."""
    return _installed


def install(conf=None):
    """Routes every CUDA allocation of this process to memcast.

    Must run before the first CUDA allocation: before anything initializes CUDA in
    PyTorch (a tensor on ``cuda``, ``torch.cuda.init()``, ...). Raises ``MemcastError``
    when it is too late. ``conf``: as in ``configure``. Idempotent."""
    global _installed
    import torch

    if _installed:
        return
    _load()
    if conf:
        configure(conf)
    if torch.cuda.is_initialized():
        raise MemcastError(
            "memcast_torch.install() is too late: CUDA is already initialized in this "
            "process, so PyTorch's allocator is in use. Call install() before the first "
            "CUDA allocation (first thing after `import torch`), or use "
            "memcast_torch.pool() with torch.cuda.use_mem_pool() instead."
        )
    try:
        torch.cuda.memory.change_current_allocator(_Pluggable(_custom_allocator()))
    except RuntimeError as e:
        raise MemcastError(
            "memcast_torch.install() is too late: PyTorch's CUDA allocator was already "
            f"used ({e}). Call install() before the first CUDA allocation."
        ) from e
    _installed = True
    # torch.cuda.empty_cache() reaches a pluggable allocator only through a reset hook
    # that Python cannot set: make it also empty memcast's cache.
    native_empty = torch.cuda.empty_cache

    def empty_cache_with_memcast():
        native_empty()
        _lib.memcast_reset()

    empty_cache_with_memcast.__doc__ = native_empty.__doc__
    torch.cuda.empty_cache = empty_cache_with_memcast
    torch.cuda.memory.empty_cache = empty_cache_with_memcast


def pool():
    """A ``torch.cuda.MemPool`` whose segments come from memcast (use with
    ``use_pool``, or ``torch.cuda.use_mem_pool`` for the calling thread only). Keep the
    pool alive while its tensors are."""
    return _new_pool()


def _new_pool():
    import torch

    _load()
    return torch.cuda.MemPool(_custom_allocator())


@contextlib.contextmanager
def use_pool(pool=None, device=None, all_threads=True):
    """Routes the allocations on ``device`` (default: the current one) to ``pool``
    (default: a new ``pool()``) while the block runs; yields the pool.

    ``all_threads=True`` routes every thread's allocations on the device, autograd's
    backward thread included: ``torch.cuda.use_mem_pool`` routes only the calling
    thread's, so a training step under it allocates its backward from PyTorch's native
    pool beside memcast's. ``all_threads=False`` is ``torch.cuda.use_mem_pool``. Keep
    the pool alive while its tensors are.

    PyTorch serves an allocation from the first pool begun whose filter takes it, and
    ``all_threads=True`` takes every allocation on the device: a
    ``torch.cuda.use_mem_pool`` or a CUDA graph capture (``torch.cuda.graph``,
    ``torch.compile``'s CUDA graphs) begun inside the block allocates from this pool,
    not from its own, and so does a nested ``use_pool`` of another pool. Nesting
    ``use_pool`` of the same pool raises PyTorch's "already recording" error."""
    import torch

    if pool is None:
        pool = _new_pool()
    d = _device(device)
    if all_threads:
        # The filter of this entry point accepts every stream of every thread.
        torch._C._cuda_beginAllocateToPool(d, pool.id)
    else:
        torch._C._cuda_beginAllocateCurrentThreadToPool(d, pool.id)
    try:
        yield pool
    finally:
        torch._C._cuda_endAllocateToPool(d, pool.id)
        torch._C._cuda_releasePool(d, pool.id)


def stats(device=None):
    """memcast's statistics for ``device`` (default: the current one) as a dict:
    ``requested``/``allocated``/``reserved`` (``current``, ``peak``), ``device_allocs``,
    ``steps``, ``device_calls`` (measured latencies), ``config``, ... ``{}`` before
    memcast's first allocation on the device."""
    d = _device(device)
    s = _text(_load().memcast_stats, d)
    return json.loads(s) if s else {}


def step(device=None):
    """Marks an iteration boundary (counted in ``stats()['steps']``, recorded by
    ``record``), then ``check()``: raises ``MemcastError`` if an allocation failed
    during the iteration."""
    d = _device(device)
    _check(_load().memcast_step(d), "step()")
    check(d)


def empty_cache(device=None):
    """Gives memcast's free cached memory on ``device`` back to the driver."""
    _check(_load().memcast_empty_cache(_device(device)), "empty_cache()")


class _Recording(object):
    def __init__(self, path, device):
        self.path = os.fspath(path)
        self.device = device
        self.done = False

    def stop(self):
        """Stops recording and writes the trace; returns its path."""
        if not self.done:
            self.done = True
            _check(
                _lib.memcast_record_stop(self.device, self.path.encode()),
                f"record({self.path!r}).stop()",
            )
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def record(path, device=None):
    """Records every allocation and free through memcast on ``device`` (and each
    ``step()`` as an iteration boundary) until ``.stop()`` (or the end of a ``with``
    block), then writes a ``.mctrace`` trace to ``path``. Allocations live at the start
    (parameters, optimizer state) become the trace's static blocks."""
    d = _device(device)
    _check(_load().memcast_record_start(d), f"record({path!r})")
    return _Recording(path, d)


def predictive(on=True):
    """Turns memcast's predictive mode on or off (a configuration key, so before the
    first allocation). Raises ``MemcastError`` if this build of memcast has no
    predictive mode."""
    configure("predictive:" + ("true" if on else "false"))


from .plan import PlanError  # noqa: E402  (pure Python, no torch import)


def offload(blocks, budget, **kw):
    """Keeps, offloads (to memcast's pinned host pool, on its low-priority transfer
    streams) or recomputes what ``blocks`` save for backward, so that a training step
    fits ``budget`` device bytes. Returns an ``Offload`` (a context manager too);
    ``memcast_torch.offloading`` documents the options and docs/oversubscription.md the
    design and the measurements."""
    from .offloading import Offload

    return Offload(blocks, budget, **kw)
