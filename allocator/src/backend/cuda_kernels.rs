//! A small PTX module for tests and measurements of [`CudaBackend`]: a kernel that
//! keeps the GPU busy for a given time and then fills memory. It makes work that is
//! really pending on a stream (a cross-stream free must wait for it; a transfer must
//! overlap it). Loaded with `cuModuleLoadData` on first use (the driver JIT-compiles
//! the PTX for the device).

use std::ffi::{c_void, CString};

use cudarc::driver::sys;

use super::cuda::{check, CudaBackend};
use super::{BackendError, DevicePtr, StreamId};

/// `spin_fill(ns, ptr, n, value)`: every thread waits until `ns` nanoseconds of the
/// global timer have passed since it started, then the block writes `value` to the
/// `n` 32-bit words at `ptr` (launch one block).
const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_fill(
    .param .u64 p_ns,
    .param .u64 p_ptr,
    .param .u32 p_n,
    .param .u32 p_val
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<9>;

    ld.param.u64 %rd1, [p_ns];
    ld.param.u64 %rd2, [p_ptr];
    ld.param.u32 %r1, [p_n];
    ld.param.u32 %r2, [p_val];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd1;
SPIN:
    mov.u64 %rd5, %globaltimer;
    setp.lt.u64 %p1, %rd5, %rd4;
    @%p1 bra SPIN;

    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
FILL:
    setp.ge.u32 %p2, %r3, %r1;
    @%p2 bra DONE;
    mul.wide.u32 %rd6, %r3, 4;
    add.u64 %rd7, %rd2, %rd6;
    st.global.u32 [%rd7], %r2;
    add.u32 %r3, %r3, %r4;
    bra FILL;
DONE:
    ret;
}
"#;

#[derive(Debug)]
pub(super) struct Kernels {
    pub module: sys::CUmodule,
    spin_fill: sys::CUfunction,
}

impl CudaBackend {
    fn kernels(&mut self) -> Result<sys::CUfunction, BackendError> {
        if let Some(k) = &self.kernels {
            return Ok(k.spin_fill);
        }
        self.bind()?;
        let image = CString::new(PTX).expect("PTX has no NUL");
        let name = CString::new("spin_fill").expect("no NUL");
        let mut module: sys::CUmodule = std::ptr::null_mut();
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: library loaded, context current; `image` is a NUL-terminated PTX
        // text alive during the call; out-pointers are live locals.
        unsafe {
            check(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void),
            )?;
            check(
                "cuModuleGetFunction",
                sys::cuModuleGetFunction(&mut f, module, name.as_ptr()),
            )?;
        }
        self.kernels = Some(Kernels {
            module,
            spin_fill: f,
        });
        Ok(f)
    }

    /// Queues on `stream` a kernel that spins for `ns` nanoseconds, then writes `value`
    /// to the `words` 32-bit words at `ptr` (`words` may be 0: spin only). The range
    /// must lie inside a live segment of this backend.
    pub fn launch_spin_fill(
        &mut self,
        stream: StreamId,
        ns: u64,
        ptr: DevicePtr,
        words: u32,
        value: u32,
    ) -> Result<(), BackendError> {
        if words > 0 {
            self.check_device_range(ptr.0, words as u64 * 4)?;
        }
        let s = self.raw_stream(stream)? as sys::CUstream;
        let f = self.kernels()?;
        self.bind()?;
        let (mut a, mut b, mut c, mut d) = (ns, ptr.0, words, value);
        let mut params: [*mut c_void; 4] = [
            &mut a as *mut u64 as *mut c_void,
            &mut b as *mut u64 as *mut c_void,
            &mut c as *mut u32 as *mut c_void,
            &mut d as *mut u32 as *mut c_void,
        ];
        // SAFETY: library loaded, context current; `f` is the function of a module
        // this backend loaded and keeps; `params` points to four live locals whose
        // types match the kernel's parameters (u64, u64, u32, u32), read during the
        // call; the written range lies in a live segment (checked above).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                1,
                1,
                1,
                256,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
