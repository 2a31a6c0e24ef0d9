package wheel

import "syscall"

// threadCPUNs returns the CPU time the calling OS thread has used, in ns.
// It lets a benchmark report its cost apart from the time it spent
// descheduled on a shared machine.
func threadCPUNs() (int64, bool) {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
