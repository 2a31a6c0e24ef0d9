package dispatch

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Every scheduled function runs once, on another goroutine, also when a run
// schedules more (as a mailbox waking another actor's does).
func TestEveryFunctionRunsOnce(t *testing.T) {
	p := New(4)
	const n = 20000
	var ran [n]atomic.Int32
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n / 2 {
		p.Schedule(func() {
			ran[i].Add(1)
			wg.Done()
			p.Schedule(func() { ran[n/2+i].Add(1); wg.Done() })
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("scheduled functions did not all run within 30 s")
	}
	for i := range ran {
		if c := ran[i].Load(); c != 1 {
			t.Fatalf("function %d ran %d times", i, c)
		}
	}
}

// Schedule never runs fn on the caller's goroutine: a mailbox scheduled from a
// run must not nest in it.
func TestScheduleDoesNotRunOnTheCaller(t *testing.T) {
	p := New(2)
	block := make(chan struct{})
	ran := make(chan struct{})
	p.Schedule(func() { <-block; close(ran) }) // the caller would block here
	close(block)
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("function did not run")
	}
}

// Runs one after the other reuse one goroutine instead of starting one each; a
// burst's extra goroutines end down to maxIdle.
func TestGoroutinesAreReused(t *testing.T) {
	p := New(3)
	for range 1000 {
		done := make(chan struct{})
		p.Schedule(func() { close(done) })
		<-done
	}
	// A run ends and its goroutine then waits: a Schedule in between may start a
	// second one, rarely more.
	if s := p.Started(); s > 10 {
		t.Fatalf("1000 sequential runs started %d goroutines, want reuse (a few)", s)
	}
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		p.Schedule(func() { <-release; wg.Done() })
	}
	close(release)
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for p.idle.Load() > p.maxIdle && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if i := p.idle.Load(); i > p.maxIdle {
		t.Fatalf("%d idle goroutines after a burst of 50, want at most %d", i, p.maxIdle)
	}
}

// An actor on the pool receives its messages in order, as with the default
// dispatcher.
func TestActorOnThePool(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	const n = 5000
	got := make(chan int, n)
	props := actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			got <- v
		}
	}, actor.WithDispatcher(New(2)))
	pid := sys.Root.Spawn(props)
	for i := range n {
		sys.Root.Send(pid, i)
	}
	for i := range n {
		select {
		case v := <-got:
			if v != i {
				t.Fatalf("message %d arrived as %d", i, v)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d did not arrive", i)
		}
	}
}
