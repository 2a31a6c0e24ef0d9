package shard

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func newTestClock(t *testing.T, b alarmBackend) *alarmClock {
	t.Helper()
	if b == nil {
		var err error
		if b, err = newAlarmBackend(); err != nil {
			t.Skipf("no alarm backend here: %v", err)
		}
	}
	c := &alarmClock{b: b}
	go c.loop() // (as the process's clock: never stopped)
	return c
}

// Alarms run in the order of their times, none before its time; one added before
// the alarm the backend waits for runs at its own time.
func TestAlarmClockOrderAndNeverEarly(t *testing.T) {
	c := newTestClock(t, nil)
	var mu sync.Mutex
	var order []int
	done := make(chan struct{})
	late := c.AfterFunc(time.Hour, func() { t.Error("the hour's alarm ran") })
	start := time.Now()
	delays := []time.Duration{30, 10, 20, 10, 1, 5} // ms, in the order added
	for i, d := range delays {
		at := start.Add(d * time.Millisecond)
		c.AfterFunc(time.Until(at), func() {
			if now := time.Now(); now.Before(at) {
				t.Errorf("alarm %d ran %v before its time", i, at.Sub(now))
			}
			mu.Lock()
			order = append(order, i)
			if len(order) == len(delays) {
				close(done)
			}
			mu.Unlock()
		})
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("alarms due in 30 ms had not all run after 10 s (one behind the hour's?)")
	}
	mu.Lock()
	defer mu.Unlock()
	for k := 1; k < len(order); k++ {
		if delays[order[k]] < delays[order[k-1]] {
			t.Fatalf("ran in the order %v of alarms due at %v ms", order, delays)
		}
	}
	if !late.Stop() {
		t.Fatal("Stop of a pending alarm said it had run")
	}
	if late.Stop() {
		t.Fatal("a second Stop said it stopped it")
	}
}

// A stopped alarm never runs; Stop after the run says so.
func TestAlarmClockStop(t *testing.T) {
	c := newTestClock(t, nil)
	stopped := c.AfterFunc(5*time.Millisecond, func() { t.Error("a stopped alarm ran") })
	ran := make(chan struct{})
	after := c.AfterFunc(20*time.Millisecond, func() { close(ran) })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending alarm said it had run")
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the alarm after a stopped one never ran")
	}
	if after.Stop() {
		t.Fatal("Stop after the run said it stopped it")
	}
}

// brokenBackend cannot be set: the clock falls back to Go's timers.
type brokenBackend struct{ block chan struct{} }

func (b brokenBackend) set(time.Time) error { return errors.New("broken") }
func (b brokenBackend) wait() error         { <-b.block; return nil }

func TestAlarmClockBackendFailureFallsBack(t *testing.T) {
	c := newTestClock(t, brokenBackend{block: make(chan struct{})})
	ran := make(chan struct{})
	c.AfterFunc(5*time.Millisecond, func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("an alarm whose backend failed never ran")
	}
}
