package core

import (
	"os"
	"unsafe"

	"github.com/kjob/kjob/persistence"
)

// Prefaulting the shard's big stores.
//
// The compact jobs' chunks (288 KiB) and the packed jobs' larger chunks are fresh
// memory, whose pages the kernel maps one fault at a time as the slots are first
// written. On a VM whose page tables the hypervisor shadows, such a fault is dear:
// 12–15 µs a 4 KiB page on the AMD EPYC kjob bench ran on (2026-12-05), where it
// was 20 % of a 1,000,000-job recovery's CPU — the one store of each replayed job
// into its chunk — against 0.3 µs on bare metal. MADV_POPULATE_WRITE (Linux 5.14;
// persistence.PopulateWrite, which the journal uses for the pages ahead of its
// writer) maps a range's pages in one call, about half the cost a page there: the
// same memory, only taken in one go. The contents are untouched (fresh pages are
// zero, a page already present stays as it is).
//
// Only chunks of a store that is already large get it: a store's first chunk
// starts at coldFirst slots and grows as it fills (compact.go), so a small app
// pays a few KiB for a few jobs.

var pageBytes = uintptr(os.Getpagesize())

// prefault maps in the whole pages of the n bytes at p (a pointer-free allocation
// the caller holds) in one system call (persistence.PopulateWrite), and reports
// whether it did. It only saves faults: a kernel that refuses leaves them to the
// first writes.
func prefault(p unsafe.Pointer, n uintptr) bool {
	off := (pageBytes - uintptr(p)%pageBytes) % pageBytes
	if n <= off {
		return false
	}
	size := (n - off) &^ (pageBytes - 1)
	return persistence.PopulateWrite(unsafe.Slice((*byte)(unsafe.Add(p, off)), size))
}
