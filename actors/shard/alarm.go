package shard

import (
	"container/heap"
	"log/slog"
	"sync"
	"time"
)

// An alarm clock runs functions at given times with microsecond precision, for the
// shards' wake-ups (a fire's due, an armed dispatch's send).
//
// Go's own timers are only as precise as the runtime's idle wait: a P with
// nothing to run sleeps in epoll_wait with a timeout in whole milliseconds
// (runtime/netpoll_epoll.go), so a timer due in 0.3 ms waits 1 ms, and one due in
// 1.7 ms first 1 ms, then 1 ms more. On a busy node something else wakes the
// runtime first; on a quieter one a fire is up to a millisecond late for nothing.
// The alarm clock keeps its alarms in one heap and the earliest in a timerfd
// (alarm_linux.go), read by one goroutine through the runtime's poller, which the
// kernel wakes at the time itself.
type alarmClock struct {
	mu  sync.Mutex
	h   alarmHeap
	set time.Time // what the backend is set to (zero: nothing)
	b   alarmBackend
}

// alarmBackend is the clock's timer: set arms it for at (replacing what it was
// set to), wait blocks until it has expired at least once.
type alarmBackend interface {
	set(at time.Time) error
	wait() error
}

// alarm is one function due at a time; Stop cancels it.
type alarm struct {
	c   *alarmClock
	at  time.Time
	fn  func()
	idx int // in the heap, -1 once fired or stopped
}

// Stop cancels the alarm; it reports whether it had not run yet.
func (a *alarm) Stop() bool {
	c := a.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.idx < 0 {
		return false
	}
	heap.Remove(&c.h, a.idx)
	return true // the backend may wake for it: the loop finds nothing due
}

// AfterFunc runs fn on the clock's goroutine once d has passed; fn must not block.
func (c *alarmClock) AfterFunc(d time.Duration, fn func()) *alarm {
	a := &alarm{c: c, at: time.Now().Add(d), fn: fn}
	c.mu.Lock()
	defer c.mu.Unlock()
	heap.Push(&c.h, a)
	if a.idx == 0 && (c.set.IsZero() || a.at.Before(c.set)) {
		c.arm(a.at)
	}
	return a
}

// arm sets the backend (c.mu held); a backend that fails falls back to Go's
// timers for the wake-up, which is only late, never lost.
func (c *alarmClock) arm(at time.Time) {
	c.set = at
	if err := c.b.set(at); err != nil {
		time.AfterFunc(time.Until(at), c.fire)
	}
}

func (c *alarmClock) loop() {
	logged := false
	for {
		if err := c.b.wait(); err != nil {
			if !logged {
				logged = true
				slog.Error("shard alarm clock: its timer cannot be read; polling every millisecond", "err", err)
			}
			time.Sleep(time.Millisecond)
		}
		c.fire()
	}
}

// fire runs every alarm that is due and sets the backend for the next one.
func (c *alarmClock) fire() {
	var due []func()
	c.mu.Lock()
	now := time.Now()
	for len(c.h) > 0 && !c.h[0].at.After(now) {
		a := heap.Pop(&c.h).(*alarm)
		due = append(due, a.fn)
	}
	c.set = time.Time{}
	if len(c.h) > 0 {
		c.arm(c.h[0].at)
	}
	c.mu.Unlock()
	for _, fn := range due {
		fn()
	}
}

type alarmHeap []*alarm

func (h alarmHeap) Len() int           { return len(h) }
func (h alarmHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h alarmHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *alarmHeap) Push(x any) {
	a := x.(*alarm)
	a.idx = len(*h)
	*h = append(*h, a)
}
func (h *alarmHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	a.idx = -1
	return a
}

// alarms is the process's alarm clock, started at its first use; nil when the
// platform has no precise backend (the shards use Go's timers then).
var alarms = sync.OnceValue(func() *alarmClock {
	b, err := newAlarmBackend()
	if err != nil {
		return nil
	}
	c := &alarmClock{b: b}
	go c.loop()
	return c
})

// AfterFunc is time.AfterFunc on the process's alarm clock where there is one: fn
// runs on the clock's goroutine and must not block. A node's journal times its
// lazy syncs with it too (persistence.Options.AfterFunc).
func AfterFunc(d time.Duration, fn func()) interface{ Stop() bool } {
	if c := alarms(); c != nil {
		return c.AfterFunc(d, fn)
	}
	return time.AfterFunc(d, fn)
}
