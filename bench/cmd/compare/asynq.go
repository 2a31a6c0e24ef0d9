package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
)

// Asynq run bounds.
const (
	asynqTaskType     = "bench:noop"
	asynqProbe        = 2_000
	asynqFarFuture    = time.Hour
	asynqFireGrace    = 30 * time.Second
	asynqMaxErrors    = 100
	asynqStartTimeout = 10 * time.Second
)

type createRun struct {
	N           int     `json:"n"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	AcksPerSec  float64 `json:"acks_per_sec"`
	Latency     dist    `json:"ack_latency"`
	Errors      int     `json:"errors"`
	// CPUSeconds is the CPU time every process of the side used while the creates
	// ran: kjob bench's (load generator, client, node), or this one's (Asynq's
	// client and the load generator) plus redis-server's; 0 when not known (a
	// Redis this program did not start).
	CPUSeconds float64 `json:"cpu_seconds"`
}

type fireRun struct {
	N              int     `json:"n"`
	OfferedPerSec  float64 `json:"offered_per_sec"`
	CreatePerSec   float64 `json:"create_acks_per_sec"`
	CreatedLate    int     `json:"created_after_due"`
	Fired          int     `json:"fired"`
	Missing        int     `json:"missing"`
	Duplicates     int     `json:"duplicates"`
	Early          int     `json:"early"`
	Retried        int     `json:"retried"`
	Lateness       dist    `json:"lateness"`
	FiresPerSec    float64 `json:"fires_per_sec"`
	FiresPerSecMax float64 `json:"fires_per_sec_max_1s"`
	// kjob only: its journal's msyncs in the fire window (a dispatch leaves once
	// its record is durable: a sync longer than the 5 ms arming lead makes fires late).
	JournalSync      *dist `json:"journal_sync,omitempty"`
	JournalSlowSyncs int   `json:"journal_syncs_over_5ms"`
	// kjob only: its process over the fire window (kjob bench's fire.process).
	Process *struct {
		Seconds     float64 `json:"seconds"`
		CPUSeconds  float64 `json:"cpu_seconds"`
		AllocBytes  float64 `json:"alloc_bytes"`
		GCCycles    int     `json:"gc_cycles"`
		GCPauseMs   float64 `json:"gc_pause_ms"`
		MinorFaults int64   `json:"minor_faults"`
		MajorFaults int64   `json:"major_faults"`
	} `json:"process,omitempty"`
	samples []int64
}

// asynqPayload is the job index and its due time (unix ns), padded to at least
// kjob's params size.
func asynqPayload(i int, dueNs int64, size int) []byte {
	b := make([]byte, max(16, size))
	binary.LittleEndian.PutUint64(b, uint64(i))
	binary.LittleEndian.PutUint64(b[8:], uint64(dueNs))
	return b
}

func redisOpt(addr string, pool int) asynq.RedisClientOpt {
	return asynq.RedisClientOpt{Addr: addr, PoolSize: pool}
}

// enqueueMany enqueues n tasks made by mk with conc in flight, in index order.
func enqueueMany(ctx context.Context, c *asynq.Client, n, conc int, mk func(i int) (*asynq.Task, []asynq.Option),
	latNs, ackNs []int64, p *bar) (int, error) {
	var next, failed atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t, opts := mk(i)
				t0 := time.Now()
				_, err := c.EnqueueContext(ctx, t, opts...)
				t1 := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					first.CompareAndSwap(nil, &err)
					if failed.Add(1) >= asynqMaxErrors {
						cancel()
					}
					continue
				}
				if latNs != nil {
					latNs[i] = t1.Sub(t0).Nanoseconds()
				}
				if ackNs != nil {
					ackNs[i] = t1.UnixNano()
				}
				p.add(1)
			}
		}()
	}
	wg.Wait()
	errs := int(failed.Load())
	if errs >= asynqMaxErrors {
		return errs, fmt.Errorf("%d enqueues failed, first: %w", errs, *first.Load())
	}
	return errs, ctx.Err()
}

// asynqCreate is kjob's create scenario on Asynq: n tasks due in an hour, conc in flight.
func asynqCreate(ctx context.Context, addr string, n, conc, payloadBytes int, label string, serverCPU func() (time.Duration, bool)) (*createRun, error) {
	c := asynq.NewClient(redisOpt(addr, conc))
	defer c.Close()
	due := time.Now().Add(asynqFarFuture).UnixNano()
	mk := func(i int) (*asynq.Task, []asynq.Option) {
		return asynq.NewTask(asynqTaskType, asynqPayload(i, due, payloadBytes)), []asynq.Option{asynq.ProcessIn(asynqFarFuture), asynq.MaxRetry(0)}
	}
	if _, err := enqueueMany(ctx, c, min(n, 1_000), conc, mk, nil, nil, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	lat := make([]int64, n)
	p := newBar(label, n)
	srv0, srvOK := serverCPU()
	cpu0, t0 := selfCPU(), time.Now()
	errs, err := enqueueMany(ctx, c, n, conc, mk, lat, nil, p)
	el, cpu := time.Since(t0), selfCPU()-cpu0
	srv1, srvOK1 := serverCPU()
	p.finish()
	if err != nil {
		return nil, err
	}
	var ok []int64
	for _, v := range lat {
		if v != 0 {
			ok = append(ok, v)
		}
	}
	r := &createRun{N: n, Concurrency: conc, Seconds: el.Seconds(), AcksPerSec: float64(len(ok)) / el.Seconds(),
		Latency: newDist(ok, 0), Errors: errs}
	if srvOK && srvOK1 {
		r.CPUSeconds = (cpu + srv1 - srv0).Seconds()
	}
	return r, nil
}

// selfCPU is the CPU time (user + system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// asynqFire is kjob's fire scenario on Asynq: a server (default settings but for
// checkInterval when non-zero) runs n tasks enqueued with ProcessIn so that they
// are due evenly at rate per second.
func asynqFire(ctx context.Context, addr string, n, rate, conc, payloadBytes int, checkInterval time.Duration, label string) (*fireRun, error) {
	count := make([]atomic.Int32, n)
	late := make([]int64, n)
	start := make([]int64, n)
	var fired, dups, early, warm atomic.Int64
	var wait atomic.Pointer[bar]
	mux := asynq.NewServeMux()
	mux.HandleFunc(asynqTaskType, func(_ context.Context, t *asynq.Task) error {
		now := time.Now().UnixNano()
		b := t.Payload()
		if len(b) < 16 {
			return nil
		}
		i := int(binary.LittleEndian.Uint64(b))
		due := int64(binary.LittleEndian.Uint64(b[8:]))
		if i < 0 || i >= n {
			warm.Add(1)
			return nil
		}
		if count[i].Add(1) > 1 {
			dups.Add(1)
			return nil
		}
		if now < due {
			early.Add(1)
		}
		late[i], start[i] = now-due, now
		fired.Add(1)
		wait.Load().add(1)
		return nil
	})
	cfg := asynq.Config{DelayedTaskCheckInterval: checkInterval, Logger: quietAsynq{}, LogLevel: asynq.FatalLevel}
	srv := asynq.NewServer(redisOpt(addr, 0), cfg)
	if err := srv.Start(mux); err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	c := asynq.NewClient(redisOpt(addr, conc))
	defer c.Close()

	// Warm-up: a task due now must run (the server is polling), then a probe of
	// enqueues far in the future sets the lead time so every task is acknowledged
	// before it is due.
	if _, err := c.EnqueueContext(ctx, asynq.NewTask(asynqTaskType, asynqPayload(-1, time.Now().UnixNano(), payloadBytes)), asynq.MaxRetry(0)); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	deadline := time.Now().Add(asynqStartTimeout)
	for warm.Load() == 0 {
		if time.Now().After(deadline) {
			return nil, errors.New("asynq: the warm-up task did not run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	far := time.Now().Add(asynqFarFuture).UnixNano()
	probe := min(asynqProbe, n)
	t0 := time.Now()
	if _, err := enqueueMany(ctx, c, probe, conc, func(int) (*asynq.Task, []asynq.Option) {
		return asynq.NewTask(asynqTaskType, asynqPayload(-1, far, payloadBytes)), []asynq.Option{asynq.ProcessIn(asynqFarFuture), asynq.MaxRetry(0)}
	}, nil, nil, nil); err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	probeRate := float64(probe) / time.Since(t0).Seconds()
	lead := time.Duration(float64(n)/probeRate*1.5*float64(time.Second)) + time.Second
	firstDue := time.Now().Add(lead).UnixNano()
	dueNs := func(i int) int64 { return firstDue + int64(i)*int64(time.Second)/int64(rate) }
	ack := make([]int64, n)
	p := newBar(label+": enqueue", n)
	c0 := time.Now()
	errs, err := enqueueMany(ctx, c, n, conc, func(i int) (*asynq.Task, []asynq.Option) {
		d := dueNs(i)
		return asynq.NewTask(asynqTaskType, asynqPayload(i, d, payloadBytes)),
			[]asynq.Option{asynq.ProcessIn(time.Until(time.Unix(0, d))), asynq.MaxRetry(0)}
	}, nil, ack, p)
	createEl := time.Since(c0)
	p.finish()
	if err != nil {
		return nil, err
	}
	w := newBar(label+": wait", n)
	w.add(fired.Load())
	wait.Store(w)
	end := time.Unix(0, dueNs(n-1)).Add(asynqFireGrace)
	for fired.Load() < int64(n-errs) && time.Now().Before(end) {
		if ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	wait.Store(nil)
	w.finish()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &fireRun{N: n, OfferedPerSec: float64(rate), CreatePerSec: float64(n-errs) / createEl.Seconds(),
		Fired: int(fired.Load()), Duplicates: int(dups.Load()), Early: int(early.Load())}
	var lates, starts []int64
	for i := range n {
		if ack[i] > dueNs(i) {
			r.CreatedLate++
		}
		if count[i].Load() == 0 {
			continue
		}
		lates = append(lates, late[i])
		starts = append(starts, start[i])
	}
	r.Missing = n - errs - r.Fired
	r.Lateness = newDist(lates, r.Missing)
	if r.Missing > 0 {
		r.Lateness.CensorMs = float64(asynqFireGrace.Milliseconds())
	}
	r.FiresPerSec, r.FiresPerSecMax = fireRates(starts)
	r.samples = lates
	return r, nil
}

// quietAsynq drops Asynq's logs (its INFO lines would tear the progress bar).
type quietAsynq struct{}

func (quietAsynq) Debug(...interface{}) {}
func (quietAsynq) Info(...interface{})  {}
func (quietAsynq) Warn(...interface{})  {}
func (quietAsynq) Error(...interface{}) {}
func (quietAsynq) Fatal(args ...interface{}) {
	panic(fmt.Sprint(args...))
}
