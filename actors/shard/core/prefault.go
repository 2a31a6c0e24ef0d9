package core

import (
	"errors"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Prefaulting the shard's big stores.
//
// The compact jobs' chunks (288 KiB) and the packed jobs' larger chunks are fresh
// memory, whose pages the kernel maps one fault at a time as the slots are first
// written. On a VM whose page tables the hypervisor shadows, such a fault is dear:
// 12–15 µs a 4 KiB page on the AMD EPYC kjob bench ran on (2026-12-05), where it
// was 20 % of a 1,000,000-job recovery's CPU — the one store of each replayed job
// into its chunk — against 0.3 µs on bare metal. MADV_POPULATE_WRITE (Linux 5.14)
// maps a range's pages in one call, about half the cost a page there: the same
// memory, only taken in one go. The contents are untouched (fresh pages are zero, a
// page already present stays as it is).
//
// Only chunks of a store that is already large get it: a small shard's first
// chunk is mostly empty, and faulting it all in would make every small app pay
// 288 KiB of resident memory for a few jobs.

// prefaultOK is cleared once the kernel refuses MADV_POPULATE_WRITE (EINVAL:
// before Linux 5.14), so it is not asked again.
var prefaultOK atomic.Bool

func init() { prefaultOK.Store(true) }

var pageBytes = uintptr(os.Getpagesize())

// prefault maps in the whole pages of the n bytes at p (a pointer-free allocation
// the caller holds) in one system call. Errors are ignored: it only saves faults.
func prefault(p unsafe.Pointer, n uintptr) {
	if !prefaultOK.Load() {
		return
	}
	off := (pageBytes - uintptr(p)%pageBytes) % pageBytes
	if n <= off {
		return
	}
	size := (n - off) &^ (pageBytes - 1)
	if size == 0 {
		return
	}
	err := unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(p, off)), size), unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) {
		prefaultOK.Store(false)
	}
}
