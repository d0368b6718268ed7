"""memcast's pinned host pool and low-priority transfer streams, as ``offload`` uses
them: one pool per device and process (one ``cuMemHostAlloc``, sub-allocated by
memcast's staging pool in ``libmemcast_torch.so``), two transfer streams of that pool
wrapped as ``torch.cuda.ExternalStream``, and the link's bandwidth measured once on it."""

import ctypes
import json
import time

import torch

_pools = {}


def _lib():
    from . import _load

    lib = _load()
    if not getattr(lib, "_offload_ready", False):
        lib.memcast_host_pool_create.restype = ctypes.c_int
        lib.memcast_host_pool_create.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.memcast_host_alloc.restype = ctypes.c_int
        lib.memcast_host_alloc.argtypes = [
            ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]
        lib.memcast_host_release.restype = ctypes.c_int
        lib.memcast_host_release.argtypes = [ctypes.c_int, ctypes.c_uint64]
        lib.memcast_transfer_stream.restype = ctypes.c_void_p
        lib.memcast_transfer_stream.argtypes = [ctypes.c_int]
        lib.memcast_host_pool_stats.restype = ctypes.c_long
        lib.memcast_host_pool_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.memcast_host_pool_destroy.restype = ctypes.c_int
        lib.memcast_host_pool_destroy.argtypes = [ctypes.c_int]
        lib._offload_ready = True
    return lib


class HostPool(object):
    """memcast's pinned host pool on one device (one ``cuMemHostAlloc``, sub-allocated)
    and its low-priority transfer streams, shared by every ``offload`` of the process."""

    def __init__(self, device, nbytes):
        from . import MemcastError, last_error

        self.device = device
        self.lib = _lib()
        t = time.perf_counter()
        if self.lib.memcast_host_pool_create(device, nbytes) != 0:
            raise MemcastError("pinned host pool of %d bytes: %s" % (nbytes, last_error()))
        self.create_s = time.perf_counter() - t
        self.size = nbytes
        raw = [self.lib.memcast_transfer_stream(device) for _ in range(2)]
        if not all(raw):
            raise MemcastError("transfer stream: %s" % last_error())
        dev = torch.device("cuda", device)
        self.d2h = torch.cuda.ExternalStream(raw[0], device=dev)
        self.h2d = torch.cuda.ExternalStream(raw[1], device=dev)
        self.bw = self._measure()

    def alloc(self, nbytes):
        """A pinned uint8 tensor of ``nbytes`` and its address, or ``(None, 0)`` when full."""
        from . import MemcastError, last_error

        addr = ctypes.c_uint64(0)
        rc = self.lib.memcast_host_alloc(self.device, nbytes, ctypes.byref(addr))
        if rc == 1:
            return None, 0
        if rc != 0:
            raise MemcastError("host pool: %s" % last_error())
        buf = (ctypes.c_uint8 * nbytes).from_address(addr.value)
        return torch.frombuffer(buf, dtype=torch.uint8), addr.value

    def release(self, addr):
        from . import MemcastError, last_error

        if self.lib.memcast_host_release(self.device, addr) != 0:
            raise MemcastError("host pool: %s" % last_error())

    def stats(self):
        from . import _text

        s = _text(self.lib.memcast_host_pool_stats, self.device)
        return json.loads(s) if s else {}

    def _measure(self, nbytes=256 << 20):
        """Measured bandwidth (bytes/s) of one copy each way between the pool and the
        device (the planner's link figures)."""
        host, addr = self.alloc(nbytes)
        if host is None:
            return None
        dev = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", self.device))
        out = {}
        for name, stream, dst, src in (("d2h", self.d2h, host, dev), ("h2d", self.h2d, dev, host)):
            for rep in range(2):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream):
                    a.record()
                    dst.copy_(src, non_blocking=True)
                    b.record()
                b.synchronize()
                out[name] = nbytes / (a.elapsed_time(b) / 1e3)
        del dev
        self.release(addr)
        return out


def host_pool(device, nbytes):
    """The process's pool on ``device``, created (or grown) to at least ``nbytes``."""
    p = _pools.get(device)
    if p is None or p.size < nbytes:
        if p is not None and p.stats().get("ranges", 0):
            raise RuntimeError("the pinned pool is in use and too small")
        _pools.pop(device, None)
        p = HostPool(device, nbytes)
        _pools[device] = p
    return p
