//go:build !linux

package wheel

// threadCPUNs is only implemented on Linux.
func threadCPUNs() (int64, bool) { return 0, false }
