//! Every export with arbitrary devices, pointers and streams: an error code or a null,
//! never a caught panic (-2) and never a panic across the boundary. The library's
//! functions behind the exports are called too, unguarded, so that a panic there fails
//! this test instead of being caught.

use std::ffi::{c_char, c_void, CString};

use memcast_torch::*;
use proptest::prelude::*;

const PANIC: i32 = -2;

fn device() -> impl Strategy<Value = i32> {
    prop_oneof![Just(0), 1..64i32, Just(64), Just(-1), any::<i32>(),]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn bad_devices_pointers_and_streams_are_error_codes(
        dev in device(),
        ptr in any::<usize>(),
        stream in any::<usize>(),
        size in any::<usize>(),
    ) {
        // Unguarded: errors, not panics.
        let _: Result<(), _> = state::existing(dev).and_then(|d| d.free(ptr as u64, stream));
        let _ = state::existing(dev).map(|d| d.stats_json());
        if !(0..64).contains(&dev) {
            prop_assert!(matches!(state::device(dev), Err(state::TorchError::BadDevice(d)) if d == dev));
        }
        // The exports.
        memcast_free(ptr as *mut c_void, size, dev, stream as *mut c_void);
        let p = memcast_malloc(size, dev, stream as *mut c_void);
        if !p.is_null() {
            memcast_free(p, size, dev, stream as *mut c_void);
        }
        prop_assert_ne!(memcast_step(dev), PANIC);
        prop_assert_ne!(memcast_empty_cache(dev), PANIC);
        let s = memcast_stats_json(dev);
        // SAFETY: null or a string from memcast_stats_json, freed once.
        unsafe { memcast_string_free(s) };
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` has 64 writable bytes.
        prop_assert_ne!(unsafe { memcast_stats(dev, buf.as_mut_ptr(), buf.len()) }, PANIC as std::ffi::c_long);
        // SAFETY: a null buffer is allowed (the length is returned).
        prop_assert_ne!(unsafe { memcast_stats(dev, std::ptr::null_mut(), 0) }, PANIC as std::ffi::c_long);
        let path = CString::new("/nonexistent-dir/x.mctrace").unwrap();
        // SAFETY: a valid C string.
        prop_assert_ne!(unsafe { memcast_record_stop(dev, path.as_ptr()) }, PANIC);
        // SAFETY: a valid buffer.
        let n = unsafe { memcast_last_error(buf.as_mut_ptr(), buf.len()) };
        prop_assert!(n >= 0);
    }
}
