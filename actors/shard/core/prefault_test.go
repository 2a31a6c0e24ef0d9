package core

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident counts the pages of b that are mapped in.
func resident(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+int(pageBytes)-1)/int(pageBytes))
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// prefault maps in every whole page of the range, and only those, and keeps what
// they hold.
func TestPrefaultMapsTheWholePagesIn(t *testing.T) {
	const pages = 64
	m, err := unix.Mmap(-1, 0, pages*int(pageBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if n := resident(t, m); n != 0 {
		t.Fatalf("%d pages resident before anything touched them", n)
	}
	m[0] = 7 // page 0 present, with data
	// From the middle of page 0 to the middle of page 40: whole pages 1..39.
	start, end := int(pageBytes)/2, 40*int(pageBytes)+int(pageBytes)/2
	if !prefault(unsafe.Pointer(&m[start]), uintptr(end-start)) {
		if err := unix.Madvise(m[50*pageBytes:51*pageBytes], unix.MADV_POPULATE_WRITE); err != nil {
			t.Skipf("MADV_POPULATE_WRITE refused (Linux before 5.14): %v", err)
		}
		t.Fatal("prefault did nothing where the kernel populates")
	}
	if n := resident(t, m[pageBytes:40*pageBytes]); n != 39 {
		t.Fatalf("%d of the 39 whole pages resident after prefault", n)
	}
	if n := resident(t, m[40*pageBytes:]); n != 0 {
		t.Fatalf("%d pages beyond the range resident", n)
	}
	if m[0] != 7 {
		t.Fatal("prefault changed a page that was present")
	}
	for i := int(pageBytes); i < 40*int(pageBytes); i += 512 {
		if m[i] != 0 {
			t.Fatalf("byte %d is %d after prefault, want 0", i, m[i])
		}
	}
	if prefault(unsafe.Pointer(&m[1]), 10) { // less than a page: nothing to do
		t.Fatal("prefault of less than a page did something")
	}
}
