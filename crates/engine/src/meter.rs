//! The allocator a worker's QuickJS runtime allocates through: rquickjs's
//! Rust-allocator adapter plus a running count of the bytes it holds.
//!
//! The worker sets the runtime's memory limit to "what the cached scripts
//! hold + `memory_limit`" after every compile and eviction. QuickJS can only
//! report its heap size by walking every object of every context, which
//! with a full cache costs milliseconds per compile; this count is read in
//! constant time. It does not enforce the limit itself: QuickJS's own
//! `set_memory_limit` check does. It refuses every allocation once the
//! watchdog has abandoned its thread ([`Watch::poisoned`]), which ends the
//! built-in loops that allocate as they go.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use rquickjs::allocator::{Allocator, RustAllocator};

use crate::watchdog::Watch;

/// What one runtime holds: the bytes allocated now, and the most it held
/// since the worker last asked ([`Meter::reset_peak`]), which tells a real
/// out-of-memory from a script's own `throw null` (QuickJS throws `null`
/// when it cannot even allocate the error).
#[derive(Default)]
pub(crate) struct Meter {
    held: Cell<usize>,
    peak: Cell<usize>,
}

impl Meter {
    /// Bytes allocated now.
    pub(crate) fn held(&self) -> usize {
        self.held.get()
    }

    /// The most bytes held since the last [`Meter::reset_peak`].
    pub(crate) fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Starts a new peak from what is held now (before each call).
    pub(crate) fn reset_peak(&self) {
        self.peak.set(self.held.get());
    }

    fn set(&self, held: usize) {
        self.held.set(held);
        if held > self.peak.get() {
            self.peak.set(held);
        }
    }
}

/// Counts the bytes currently allocated by one runtime.
pub(crate) struct MeteredAllocator {
    meter: Rc<Meter>,
    watch: Arc<Watch>,
}

impl MeteredAllocator {
    /// An allocator for the runtime of the thread `watch` watches, and the
    /// meter it keeps up to date.
    pub(crate) fn new(watch: Arc<Watch>) -> (MeteredAllocator, Rc<Meter>) {
        let meter = Rc::new(Meter::default());
        (
            MeteredAllocator {
                meter: Rc::clone(&meter),
                watch,
            },
            meter,
        )
    }

    fn add(&self, ptr: *mut u8) {
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by RustAllocator.
            let size = unsafe { RustAllocator::usable_size(ptr) };
            self.meter.set(self.meter.held().saturating_add(size));
        }
    }

    fn sub(&self, ptr: *mut u8) {
        if !ptr.is_null() {
            // SAFETY: callers pass pointers allocated by RustAllocator and
            // not yet freed.
            let size = unsafe { RustAllocator::usable_size(ptr) };
            self.meter.held.set(self.meter.held().saturating_sub(size));
        }
    }
}

// SAFETY: every call is forwarded to RustAllocator, which upholds the
// trait's contract; the counting only reads sizes of live allocations.
unsafe impl Allocator for MeteredAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if self.watch.poisoned() {
            return std::ptr::null_mut();
        }
        let ptr = RustAllocator.alloc(size);
        self.add(ptr);
        ptr
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        if self.watch.poisoned() {
            return std::ptr::null_mut();
        }
        let ptr = RustAllocator.calloc(count, size);
        self.add(ptr);
        ptr
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        self.sub(ptr);
        // SAFETY: forwarded contract: `ptr` came from this allocator.
        unsafe { RustAllocator.dealloc(ptr) }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        // QuickJS never reallocates null, but RustAllocator must not see it.
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        if self.watch.poisoned() {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded contract: `ptr` came from this allocator.
        let old = unsafe { RustAllocator::usable_size(ptr) };
        // SAFETY: forwarded contract.
        let new = unsafe { RustAllocator.realloc(ptr, new_size) };
        if !new.is_null() {
            self.meter.held.set(self.meter.held().saturating_sub(old));
            self.add(new);
        }
        new
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: forwarded contract.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}
