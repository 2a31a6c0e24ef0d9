//go:build linux

package shard

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// timerfd is the alarm clock's backend on Linux: a CLOCK_MONOTONIC timerfd (the
// clock of Go's monotonic readings), non-blocking so that reading it parks the
// goroutine in the runtime's poller instead of holding a thread.
type timerfd struct {
	f  *os.File
	rc syscall.RawConn
}

func newAlarmBackend() (alarmBackend, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "kjob-alarm")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &timerfd{f: f, rc: rc}, nil
}

func (t *timerfd) set(at time.Time) error {
	d := time.Until(at)
	if d <= 0 {
		d = 1 // zero would disarm it
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	var serr error
	if err := t.rc.Control(func(fd uintptr) { serr = unix.TimerfdSettime(int(fd), 0, &spec, nil) }); err != nil {
		return err
	}
	return serr
}

func (t *timerfd) wait() error {
	var buf [8]byte
	_, err := t.f.Read(buf[:]) // the expirations since the last read; blocks in the poller
	return err
}
