package sim

import (
	"container/heap"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"strings"

	"github.com/kjob/kjob/messages"
)

// startMs is the virtual Unix time at which every run starts (2024-03-09 12:00 UTC,
// a day before a US daylight-saving change, so zoned cron jobs meet odd days).
const startMs = 1_709_985_600_000

// event is one thing that happens at a virtual time. Events at the same time run in
// the order they were scheduled (seq), so the queue never depends on anything but
// the seed.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

// clock is a node's view of time: the simulation's time plus a skew that jumps.
// maxSeen is the latest time the clock ever showed, so "never early" can be judged
// against the clock the node had, even after it jumped back.
type clock struct {
	skew    int64
	maxSeen int64
	jumps   int64 // bumped on every jump: timings across a jump are not exact
}

// Sim is one simulated cluster run. Everything happens on one goroutine, driven by
// one seeded PCG; nothing reads the wall clock, and every map that is iterated is
// iterated in sorted order.
type Sim struct {
	cfg  Config
	rng  *rand.Rand
	now  int64 // virtual time, Unix ms
	end  int64
	heal int64
	step int64
	seq  uint64
	q    eventQueue

	hash    hash.Hash64
	ring    []string
	ringN   int
	fail    *Failure
	known   []*Failure // known bugs noted without stopping the run (see notef)
	stats   Stats
	healed  bool
	settled bool
	final   bool // the end-of-run checks are running

	servers []*server
	workers []*worker
	clients []*client
	apps    []string
	nodes   map[string]node
	ns      *nsHost
	nsGen   int
	part    map[string]bool // one side of the current partition (nil: none)
	chk     *checker
	shape   string
}

// Run simulates cfg and reports what it found.
func Run(cfg Config) Result {
	cfg.defaults()
	s := &Sim{
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		now:   startMs,
		end:   startMs + cfg.DurationMs,
		heal:  startMs + cfg.HealMs,
		hash:  fnv.New64a(),
		ring:  make([]string, cfg.TailLines),
		nodes: map[string]node{},
	}
	s.chk = newChecker(s)
	s.build()
	s.loop()
	if s.fail == nil && (cfg.Steps == 0 || s.step < cfg.Steps) {
		s.final = true
		s.chk.final()
	}
	res := Result{Seed: cfg.Seed, Steps: s.step, EndMs: s.now - startMs, Failure: s.fail, Known: s.known, Stats: s.stats, Shape: s.shape}
	res.Stats.Events = s.step
	if s.fail != nil {
		s.fail.Tail = s.tail()
	}
	res.Hash = s.hash.Sum64()
	return res
}

func (s *Sim) loop() {
	for len(s.q) > 0 && s.fail == nil {
		if s.cfg.Steps > 0 && s.step >= s.cfg.Steps {
			s.tracef("stop: step limit %d reached", s.cfg.Steps)
			return
		}
		e := heap.Pop(&s.q).(*event)
		if e.at > s.end {
			return
		}
		s.now = e.at
		s.step++
		e.fn()
	}
}

// after schedules fn delayMs from now (0: after the events already due now).
func (s *Sim) after(delayMs int64, fn func()) {
	if delayMs < 0 {
		delayMs = 0
	}
	s.seq++
	heap.Push(&s.q, &event{at: s.now + delayMs, seq: s.seq, fn: fn})
}

// every runs fn every periodMs (plus up to jitterMs), starting after the first
// period, for as long as fn returns true.
func (s *Sim) every(periodMs, jitterMs int64, fn func() bool) {
	var tick func()
	tick = func() {
		if fn() {
			s.after(periodMs+s.int64n(jitterMs+1), tick)
		}
	}
	s.after(periodMs+s.int64n(jitterMs+1), tick)
}

// ---------------------------------------------------------------- randomness

func (s *Sim) int64n(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return s.rng.Int64N(n)
}

// between is a uniform value in [lo, hi].
func (s *Sim) between(lo, hi int64) int64 { return lo + s.int64n(hi-lo+1) }

func (s *Sim) chance(p float64) bool { return s.rng.Float64() < p }

func (s *Sim) faulty(f Fault) bool { return !s.healed && s.cfg.Faults&f != 0 }

// ---------------------------------------------------------------- clocks

// local is the time on clock c now.
func (s *Sim) local(c *clock) int64 {
	t := s.now + c.skew
	if t > c.maxSeen {
		c.maxSeen = t
	}
	return t
}

// globalAt is the simulation time at which clock c shows localMs.
func (s *Sim) globalAt(c *clock, localMs int64) int64 { return localMs - c.skew }

// ---------------------------------------------------------------- trace

// tracef appends one line to the trace: it feeds the run's hash and the tail kept
// for a failure report, and goes to Config.Trace when set.
func (s *Sim) tracef(format string, args ...any) {
	line := fmt.Sprintf("%d %d ", s.step, s.now-startMs) + fmt.Sprintf(format, args...)
	_, _ = s.hash.Write([]byte(line))
	_, _ = s.hash.Write([]byte{'\n'})
	s.ring[s.ringN%len(s.ring)] = line
	s.ringN++
	if s.cfg.Trace != nil {
		_, _ = fmt.Fprintln(s.cfg.Trace, line)
	}
}

func (s *Sim) tail() []string {
	n := min(s.ringN, len(s.ring))
	out := make([]string, 0, n)
	for i := s.ringN - n; i < s.ringN; i++ {
		out = append(out, s.ring[i%len(s.ring)])
	}
	return out
}

// failf records the first broken invariant; the run stops after the current event.
func (s *Sim) failf(invariant, format string, args ...any) {
	if s.fail != nil {
		return
	}
	s.fail = &Failure{Invariant: invariant, Message: fmt.Sprintf(format, args...), Seed: s.cfg.Seed,
		Step: s.step, AtMs: s.now - startMs, Replay: s.cfg.ReplayCommand(), Final: s.final}
	s.tracef("FAIL %s: %s", invariant, s.fail.Message)
}

// notef records a broken invariant that is a known open bug whose effects stay with
// the job it hit: the first one of each kind is kept, and the run goes on.
func (s *Sim) notef(invariant, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.tracef("KNOWN %s: %s", invariant, msg)
	for _, k := range s.known {
		if k.Invariant == invariant {
			return
		}
	}
	s.known = append(s.known, &Failure{Invariant: invariant, Message: msg, Seed: s.cfg.Seed, Step: s.step,
		AtMs: s.now - startMs, Replay: s.cfg.ReplayCommand(), Tail: s.tail()})
}

// ---------------------------------------------------------------- topology

// build chooses the cluster's shape from the seed and starts every node.
func (s *Sim) build() {
	nServers := []int{1, 2, 2, 3, 3}[s.rng.IntN(5)]
	nApps := 1 + s.rng.IntN(3)
	for i := range nServers {
		srv := newServer(s, i)
		s.servers = append(s.servers, srv)
		s.nodes[srv.addr] = srv
	}
	for i := range nApps {
		s.apps = append(s.apps, fmt.Sprintf("app%d", i+1))
	}
	wi := 0
	for _, app := range s.apps {
		for range 1 + s.rng.IntN(2) {
			w := newWorker(s, wi, app)
			s.workers = append(s.workers, w)
			s.nodes[w.addr] = w
			wi++
		}
	}
	nClients := 1 + s.rng.IntN(3)
	for i := range nClients {
		c := newClient(s, i)
		s.clients = append(s.clients, c)
		s.nodes[c.addr] = c
	}
	s.shape = fmt.Sprintf("%d servers, %d apps, %d workers, %d clients", nServers, nApps, len(s.workers), nClients)
	if s.cfg.Faults&FaultClock != 0 {
		for _, n := range s.allNodes() {
			n.clk().skew = s.between(-300, 300)
		}
	}
	s.tracef("start seed=%d faults=%s shape=%q mutations=%+v", s.cfg.Seed, s.cfg.Faults, s.shape, s.cfg.Mutations)
	for _, srv := range s.servers {
		srv.start()
	}
	s.electNameServer()
	for _, w := range s.workers {
		s.after(s.between(0, 1500), w.start)
	}
	for _, c := range s.clients {
		s.after(s.between(500, 2500), c.start)
	}
	s.after(s.heal-s.now, s.healAll)
	s.after(s.heal+SettleMs-s.now, func() {
		s.settled = true
		s.tracef("settled: liveness checks on")
		s.chk.settle()
		if s.cfg.CheckBalance {
			s.every(1_000, 0, func() bool { s.chk.balanceTick(); return s.fail == nil })
		}
	})
	if s.cfg.Faults != 0 {
		s.after(s.between(1000, 3000), s.chaos)
	}
	s.every(5_000, 1_000, func() bool { s.chk.checkpoint(); return true })
}

// node is anything with an address on the simulated network.
type node interface {
	address() string
	alive() bool
	incarnation() int
	clk() *clock
	deliver(from, to *messages.Ref, m any)
}

func (s *Sim) allNodes() []node {
	out := make([]node, 0, len(s.servers)+len(s.workers)+len(s.clients))
	for _, x := range s.servers {
		out = append(out, x)
	}
	for _, x := range s.workers {
		out = append(out, x)
	}
	for _, x := range s.clients {
		out = append(out, x)
	}
	return out
}

// ---------------------------------------------------------------- faults

// chaos injects one fault and schedules the next, until the heal.
func (s *Sim) chaos() {
	if s.healed {
		return
	}
	type choice struct {
		f      Fault
		weight int
		do     func()
	}
	choices := []choice{
		{FaultCrash, 3, s.crashServer},
		{FaultWorkerCrash, 2, s.crashWorker},
		{FaultClientCrash, 1, s.crashClient},
		{FaultPartition, 2, s.partition},
		{FaultClock, 1, s.jumpClock},
		{FaultSlow, 1, s.slowNode},
		{FaultMove, 4, s.injectMove},
	}
	total := 0
	for _, c := range choices {
		if s.cfg.Faults&c.f != 0 {
			total += c.weight
		}
	}
	if total > 0 {
		r := s.rng.IntN(total)
		for _, c := range choices {
			if s.cfg.Faults&c.f == 0 {
				continue
			}
			if r < c.weight {
				c.do()
				break
			}
			r -= c.weight
		}
	}
	s.after(s.between(300, 2500), s.chaos)
}

func (s *Sim) crashServer() {
	srv := s.servers[s.rng.IntN(len(s.servers))]
	if !srv.up {
		return
	}
	if s.chance(0.5) && srv.j.unsynced() == 0 {
		// Aim at the window that matters: right after the next append, before its fsync.
		srv.crashOnAppend = true
		s.tracef("chaos: %s will crash right after its next append", srv.addr)
		return
	}
	srv.crash("chaos")
	s.after(s.between(100, 4000), srv.restart)
}

func (s *Sim) crashWorker() {
	w := s.workers[s.rng.IntN(len(s.workers))]
	if !w.up {
		return
	}
	w.crash()
	s.after(s.between(100, 5000), w.start)
}

func (s *Sim) crashClient() {
	c := s.clients[s.rng.IntN(len(s.clients))]
	if !c.up {
		return
	}
	c.crash()
	s.after(s.between(100, 3000), c.start)
}

func (s *Sim) partition() {
	if s.part != nil {
		return
	}
	nodes := s.allNodes()
	side := map[string]bool{}
	for _, n := range nodes {
		if s.chance(0.35) {
			side[n.address()] = true
		}
	}
	if len(side) == 0 || len(side) == len(nodes) {
		return
	}
	s.part = side
	s.stats.Partitions++
	s.tracef("chaos: partition %s | rest", strings.Join(sortedKeys(side), ","))
	s.after(s.between(300, 5000), s.healPartition)
}

func (s *Sim) healPartition() {
	if s.part != nil {
		s.part = nil
		s.tracef("partition healed")
	}
}

func (s *Sim) jumpClock() {
	nodes := s.allNodes()
	n := nodes[s.rng.IntN(len(nodes))]
	c := n.clk()
	d := s.between(20, 2000)
	if s.chance(0.3) {
		d = -s.between(10, 300)
	}
	c.skew += d
	c.jumps++
	s.stats.ClockJumps++
	s.tracef("chaos: clock of %s jumps %+d ms (skew %d)", n.address(), d, c.skew)
	if srv, ok := n.(*server); ok && srv.up {
		srv.rearmAll()
	}
}

func (s *Sim) slowNode() {
	nodes := s.allNodes()
	n := nodes[s.rng.IntN(len(nodes))]
	switch x := n.(type) {
	case *server:
		x.slow = true
	case *worker:
		x.slow = true
	case *client:
		x.slow = true
	}
	s.tracef("chaos: %s is slow", n.address())
	s.after(s.between(500, 5000), func() {
		switch x := n.(type) {
		case *server:
			x.slow = false
		case *worker:
			x.slow = false
		case *client:
			x.slow = false
		}
		s.tracef("%s is fast again", n.address())
	})
}

func (s *Sim) isSlow(addr string) bool {
	switch x := s.nodes[addr].(type) {
	case *server:
		return x.slow
	case *worker:
		return x.slow
	case *client:
		return x.slow
	}
	return false
}

// healAll stops every fault: from here on the run must recover and make progress.
func (s *Sim) healAll() {
	s.healed = true
	s.part = nil
	s.tracef("heal: faults stop")
	for _, srv := range s.servers {
		srv.slow = false
		srv.crashOnAppend = false
		if !srv.up {
			s.after(s.between(0, 500), srv.restart)
		}
	}
	for _, w := range s.workers {
		w.slow = false
		if !w.up {
			s.after(s.between(0, 500), w.start)
		}
	}
	for _, c := range s.clients {
		c.slow = false
		if !c.up {
			s.after(s.between(0, 500), c.start)
		}
	}
}

// ---------------------------------------------------------------- NameServer placement

// electNameServer keeps the NameServer on the first live server, as the cluster's
// identity lookup would: when that member changes, a fresh NameServer (empty soft
// state) activates on the new one and rebuilds from heartbeats.
func (s *Sim) electNameServer() {
	var host *server
	for _, srv := range s.servers {
		if srv.up {
			host = srv
			break
		}
	}
	if s.ns != nil && host == s.ns.srv {
		return
	}
	if host == nil {
		if s.ns != nil {
			s.tracef("nameserver: gone (no live server)")
		}
		s.ns = nil
		return
	}
	s.ns = newNSHost(s, host)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}
