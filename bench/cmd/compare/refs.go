package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kjob/kjob/persistence"
)

// Reference bounds.
const (
	refLead          = 300 * time.Millisecond
	refFsyncDuration = 3 * time.Second
	refFsyncFileSize = 64 << 20
	refRecordBytes   = 128
)

// afterFuncResult is the in-memory limit for lateness: the Go runtime's timers.
type afterFuncResult struct {
	N        int     `json:"n"`
	Rate     float64 `json:"rate"`
	Lateness dist    `json:"lateness"`
	samples  []int64
}

// refAfterFunc arms n time.AfterFunc timers due evenly at rate per second and
// measures due → callback.
func refAfterFunc(ctx context.Context, n, rate int) (*afterFuncResult, error) {
	late := make([]int64, n)
	var done atomic.Int64
	all := make(chan struct{})
	t0 := time.Now().Add(refLead)
	timers := make([]*time.Timer, n)
	for i := range n {
		due := t0.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
		timers[i] = time.AfterFunc(time.Until(due), func() {
			late[i] = time.Since(due).Nanoseconds()
			if done.Add(1) == int64(n) {
				close(all)
			}
		})
	}
	window := time.Duration(int64(n) * int64(time.Second) / int64(rate))
	select {
	case <-all:
	case <-time.After(refLead + window + 10*time.Second):
		return nil, fmt.Errorf("time.AfterFunc: only %d of %d timers fired", done.Load(), n)
	case <-ctx.Done():
		for _, t := range timers {
			t.Stop()
		}
		return nil, ctx.Err()
	}
	return &afterFuncResult{N: n, Rate: float64(rate), Lateness: newDist(late, 0), samples: late}, nil
}

// fsyncResult is the physical limit for synchronous acks on this disk: one writer,
// one 128-byte journal frame written and fdatasynced at a time.
type fsyncResult struct {
	Dir        string  `json:"dir"`
	Records    int     `json:"records"`
	PerSec     float64 `json:"per_sec"`
	LatencyP50 float64 `json:"p50_ms"`
	LatencyP99 float64 `json:"p99_ms"`
}

func refFsync(dir string) (*fsyncResult, error) {
	path := filepath.Join(dir, "fsync-ref")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer os.Remove(path)
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, refFsyncFileSize); err != nil {
		return nil, fmt.Errorf("fallocate: %w", err)
	}
	rec := persistence.AppendRecord(nil, persistence.Record{LSN: 1, Stream: 1, Type: 1,
		Payload: make([]byte, refRecordBytes-persistence.FrameSize(0))})
	var lat []int64
	off := int64(0)
	t0 := time.Now()
	for time.Since(t0) < refFsyncDuration {
		s := time.Now()
		if off+int64(len(rec)) > refFsyncFileSize {
			off = 0
		}
		if _, err := f.WriteAt(rec, off); err != nil {
			return nil, err
		}
		off += int64(len(rec))
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(s).Nanoseconds())
	}
	el := time.Since(t0)
	d := newDist(lat, 0)
	return &fsyncResult{Dir: dir, Records: len(lat), PerSec: float64(len(lat)) / el.Seconds(), LatencyP50: d.P50Ms, LatencyP99: d.P99Ms}, nil
}
