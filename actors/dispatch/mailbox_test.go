package dispatch

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// recorder is a MessageInvoker that records what the mailbox runs.
type recorder struct {
	mu  sync.Mutex
	got []any
}

func (r *recorder) InvokeSystemMessage(m any) { r.add(m) }
func (r *recorder) InvokeUserMessage(m any)   { r.add(m) }
func (r *recorder) EscalateFailure(reason, _ any) {
	panic(reason)
}

func (r *recorder) add(m any) {
	r.mu.Lock()
	r.got = append(r.got, m)
	r.mu.Unlock()
}

func (r *recorder) wait(t *testing.T, n int) []any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got := append([]any(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages ran: %v", len(got), n, got)
		}
		time.Sleep(time.Millisecond)
	}
}

// Posted before the handlers and before Start, in spawn's order: kept, then run in
// Start with the system messages first and the user messages in order.
func TestMailboxKeepsWhatComesBeforeStart(t *testing.T) {
	mb := Mailbox()
	mb.PostUserMessage("u1") // before RegisterHandlers: would panic on the default mailbox
	mb.PostSystemMessage("s1")
	r := &recorder{}
	mb.RegisterHandlers(r, New(2))
	mb.PostUserMessage("u2")
	mb.PostSystemMessage("started")
	time.Sleep(10 * time.Millisecond)
	r.mu.Lock()
	early := len(r.got)
	r.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d messages ran before Start", early)
	}
	mb.Start()
	mb.PostUserMessage("u3")
	got := r.wait(t, 5)
	want := []any{"s1", "started", "u1", "u2", "u3"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ran %v, want %v", got, want)
		}
	}
}

// Posts racing with Start from many goroutines: each is run once, and each
// sender's messages in the order it sent them.
func TestMailboxPostsRacingStart(t *testing.T) {
	for round := range 200 {
		mb := Mailbox()
		r := &recorder{}
		const senders, each = 4, 50
		var wg sync.WaitGroup
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					mb.PostUserMessage([2]int{s, i})
				}
			}()
		}
		mb.RegisterHandlers(r, New(2))
		mb.Start()
		wg.Wait()
		got := r.wait(t, senders*each)
		next := make([]int, senders)
		for _, m := range got {
			v := m.([2]int)
			if v[1] != next[v[0]] {
				t.Fatalf("round %d: sender %d's message %d ran when %d was next (%v)", round, v[0], v[1], next[v[0]], got)
			}
			next[v[0]]++
		}
	}
}

// A message for a name sent while proto.actor is spawning it — after the name is
// registered, before the mailbox has its dispatcher (held there by an OnInit, which
// spawn runs in that window) — reaches the actor after Started. With the default
// mailbox (mailbox nil below) the send panics.
func TestSendDuringSpawn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mailbox actor.MailboxProducer
	}{{"dispatch.Mailbox", Mailbox}, {"default", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			sys := actor.NewActorSystem()
			defer sys.Shutdown()
			got := make(chan any, 10)
			inWindow, proceed := make(chan struct{}), make(chan struct{})
			opts := []actor.PropsOption{actor.WithDispatcher(Shared), actor.WithOnInit(func(actor.Context) {
				close(inWindow)
				<-proceed
			})}
			if tc.mailbox != nil {
				opts = append(opts, actor.WithMailbox(tc.mailbox))
			}
			props := actor.PropsFromFunc(func(c actor.Context) {
				switch m := c.Message().(type) {
				case *actor.Started:
					got <- "started"
				case int:
					got <- m
				}
			}, opts...)
			spawned := make(chan error, 1)
			go func() {
				_, err := sys.Root.SpawnNamed(props, "target")
				spawned <- err
			}()
			<-inWindow
			panicked := func() (p any) {
				defer func() { p = recover() }()
				pid := actor.NewPID(sys.Address(), "target")
				for i := range 3 {
					sys.Root.Send(pid, i)
				}
				return nil
			}()
			close(proceed)
			if err := <-spawned; err != nil {
				t.Fatal(err)
			}
			if tc.mailbox == nil {
				if panicked == nil {
					t.Fatal("the default mailbox took a send during spawn: the wrapper may be unneeded now")
				}
				return
			}
			if panicked != nil {
				t.Fatalf("send during spawn panicked: %v", panicked)
			}
			want := []any{"started", 0, 1, 2}
			for i, w := range want {
				select {
				case m := <-got:
					if m != w {
						t.Fatalf("message %d was %v, want %v", i, m, w)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("message %d (%v) did not arrive", i, w)
				}
			}
		})
	}
}
