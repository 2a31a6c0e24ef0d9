package server

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var cpuMu sync.Mutex
var lastCPU, lastWall time.Duration

// cpuLoad is this process's CPU use since the last call, as a fraction of all cores.
func cpuLoad() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	wall := time.Duration(time.Now().UnixNano())
	cpuMu.Lock()
	defer cpuMu.Unlock()
	var f float64
	if lastWall != 0 && wall > lastWall {
		f = float64(cpu-lastCPU) / float64(wall-lastWall) / float64(runtime.NumCPU())
	}
	lastCPU, lastWall = cpu, wall
	return min(max(f, 0), 1)
}

// memLoad is the machine's used memory fraction (from /proc/meminfo; 0 if unknown).
func memLoad() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var total, avail float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	if total == 0 {
		return 0
	}
	return 1 - avail/total
}
