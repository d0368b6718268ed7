//! `naive`: one device allocation per request (`cudaMalloc` / `cudaFree` each time),
//! rounded to 512 bytes. The floor for reserved bytes and the ceiling for device calls.

use crate::backend::{DeviceBackend, DevicePtr, StreamPriority};
use crate::error::AllocError;
use crate::replay::ReplayTarget;

/// Every request straight to the device.
pub struct Naive<B: DeviceBackend> {
    backend: B,
    reserved: u64,
    peak: u64,
    allocs: u64,
    frees: u64,
}

impl<B: DeviceBackend> Naive<B> {
    pub fn new(backend: B) -> Self {
        Naive {
            backend,
            reserved: 0,
            peak: 0,
            allocs: 0,
            frees: 0,
        }
    }
}

impl<B: DeviceBackend> ReplayTarget for Naive<B> {
    type Handle = (DevicePtr, u64);
    fn alloc(&mut self, bytes: u64, stream: u32) -> Result<(DevicePtr, u64), AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        let size = bytes.next_multiple_of(512);
        let p = self.backend.allocate(size, stream).map_err(|source| {
            if source.is_oom() {
                AllocError::OutOfMemory {
                    requested: size,
                    stream,
                    reserved: self.reserved,
                    allocated: self.reserved,
                    source,
                }
            } else {
                AllocError::Backend(source)
            }
        })?;
        self.reserved += size;
        self.peak = self.peak.max(self.reserved);
        self.allocs += 1;
        Ok((p, size))
    }
    fn free(&mut self, h: (DevicePtr, u64), stream: u32) -> Result<(), AllocError> {
        self.backend.deallocate(h.0, h.1, stream)?;
        self.reserved -= h.1;
        self.frees += 1;
        Ok(())
    }
    fn create_stream(&mut self) -> Result<u32, AllocError> {
        Ok(self.backend.create_stream(StreamPriority::Normal)?)
    }
    fn reserved(&self) -> u64 {
        self.reserved
    }
    fn peak_reserved(&self) -> u64 {
        self.peak
    }
    fn device_allocs(&self) -> u64 {
        self.allocs
    }
    fn device_frees(&self) -> u64 {
        self.frees
    }
    fn free_and_largest(&self) -> (u64, u64) {
        (0, 0)
    }
    fn device_time_us(&self) -> f64 {
        self.backend.stall_us()
    }
    fn advance_us(&mut self, us: f64) {
        self.backend.advance_us(us)
    }
}
