package sim

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	shardcore "github.com/kjob/kjob/actors/shard/core"
)

var (
	longSweep  = flag.Bool("sim.long", false, "sweep LongSeeds seeds (or KJOB_SIM_SEEDS) instead of the CI sweep")
	sweepSeeds = flag.Int("sim.seeds", 0, "seeds to sweep (0: CI default, or KJOB_SIM_SEEDS)")
	sweepFrom  = flag.Uint64("sim.from", 1, "first seed of the sweep")
)

const (
	// CISeeds is the sweep of a plain `go test ./sim`: about 45 s on 2 cores
	// (seeds run side by side, one goroutine each); -short runs a tenth.
	CISeeds = 8000
	// LongSeeds is the sweep of -sim.long.
	LongSeeds = 50_000
	// mutationBound is how many seeds a mutation may survive before the test fails.
	mutationBound = 100
)

// knownBugs are open bugs, outside sim/, that the simulator found: a failure with
// one of these invariants is reported, not failed, by the sweep (TestRegressions
// checks they still reproduce; remove an entry when its bug is fixed).
var knownBugs = map[string]string{} // none open: see doc.go for the ones fixed

func sweepSize() int {
	if *sweepSeeds > 0 {
		return *sweepSeeds
	}
	if v := os.Getenv("KJOB_SIM_SEEDS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	if *longSweep {
		return LongSeeds
	}
	if testing.Short() {
		return CISeeds / 10
	}
	return CISeeds
}

// TestDeterminism runs the same seeds twice, with every fault and with a mutation,
// and compares the trace hashes and the traces themselves.
func TestDeterminism(t *testing.T) {
	cfgs := []Config{DefaultConfig(1), DefaultConfig(2), DefaultConfig(3), DefaultConfig(7)}
	mut := DefaultConfig(4)
	mut.Mutations.FireEarlyMs = 1
	cfgs = append(cfgs, mut, Config{Seed: 5, Faults: FaultLoss | FaultCrash})
	for _, cfg := range cfgs {
		var t1, t2 bytes.Buffer
		a, b := cfg, cfg
		a.Trace, b.Trace = &t1, &t2
		r1, r2 := Run(a), Run(b)
		if r1.Hash != r2.Hash || r1.Steps != r2.Steps {
			t.Fatalf("seed %d: two runs differ: hash %x / %x, steps %d / %d", cfg.Seed, r1.Hash, r2.Hash, r1.Steps, r2.Steps)
		}
		if !bytes.Equal(t1.Bytes(), t2.Bytes()) {
			t.Fatalf("seed %d: equal hashes but different traces", cfg.Seed)
		}
		if r1.Failure == nil && r1.Steps < 500 {
			t.Fatalf("seed %d: only %d steps: the run did not get going", cfg.Seed, r1.Steps)
		}
	}
	if a, b := Run(DefaultConfig(1)).Hash, Run(DefaultConfig(2)).Hash; a == b {
		t.Fatalf("seeds 1 and 2 have the same trace hash %x", a)
	}
}

// TestSweep runs sweepSize() seeds with every fault; any broken invariant that is
// not a known bug fails the test with its seed, step and trace tail.
func TestSweep(t *testing.T) {
	n := sweepSize()
	start := time.Now()
	var total Stats
	var steps int64
	known := map[string][]uint64{}
	failed := 0
	results := runSeeds(n, func(i int) Config { return DefaultConfig(*sweepFrom + uint64(i)) })
	for i, r := range results {
		seed := *sweepFrom + uint64(i)
		steps += r.Steps
		add(&total, r.Stats)
		for _, k := range r.Known {
			known[k.Invariant] = append(known[k.Invariant], seed)
		}
		if f := r.Failure; f != nil {
			if _, ok := knownBugs[f.Invariant]; ok {
				known[f.Invariant] = append(known[f.Invariant], seed)
				continue
			}
			failed++
			t.Errorf("%s", f.Error())
			if failed >= 3 {
				t.Fatalf("stopping after %d failures", failed)
			}
		}
	}
	d := time.Since(start)
	t.Logf("%d seeds in %v: %.0f seeds/s, %.0f events/s", n, d.Round(time.Millisecond), float64(n)/d.Seconds(), float64(steps)/d.Seconds())
	t.Logf("in all: %d events, %d msgs (%d dropped, %d duplicated), crashes %d servers / %d workers / %d clients, "+
		"%d torn tails, %d fsync failures, %d partitions, %d clock jumps, %d handoffs done (%d splits; %d begun, %d ordered by the NameServer), "+
		"%d calls (%d acked, %d gave up; %d create batches of %d creates, %d creates then alone), "+
		"%d fires, %d executions, %d retries, %d dead letters, %d recoveries (%d shards from a snapshot; %d snapshots written), %d stale-epoch results, %d calls refused on a full disk",
		total.Events, total.Messages, total.Dropped, total.Duplicated,
		total.ServerCrashes, total.WorkerCrashes, total.ClientCrashes,
		total.TornTails, total.FsyncFailures, total.Partitions, total.ClockJumps,
		total.MovesDone, total.SplitsDone, total.Moves, total.MoveOrders, total.Ops, total.OpsAcked, total.OpsGaveUp,
		total.Batches, total.BatchedCreates, total.BatchFallbacks,
		total.Fires, total.Executions, total.Retries, total.DeadLetters,
		total.Recoveries, total.SnapshotsLoaded, total.Snapshots, total.StaleResults, total.NoRoomRefusals)
	for _, inv := range sortedKeys(known) {
		seeds := known[inv]
		t.Logf("KNOWN BUG %s hit by %d of %d seeds (first: %v): %s", inv, len(seeds), n, seeds[:min(len(seeds), 8)], knownBugs[inv])
	}
}

// runSeeds runs n configurations on every core. Each run is one goroutine with its
// own state (the package has none), so running seeds side by side changes nothing
// in any of them; results come back in order.
func runSeeds(n int, cfg func(i int) Config) []Result {
	out := make([]Result, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = Run(cfg(i))
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

func add(t *Stats, s Stats) {
	t.Events += s.Events
	t.Messages += s.Messages
	t.Dropped += s.Dropped
	t.Duplicated += s.Duplicated
	t.ServerCrashes += s.ServerCrashes
	t.WorkerCrashes += s.WorkerCrashes
	t.ClientCrashes += s.ClientCrashes
	t.TornTails += s.TornTails
	t.FsyncFailures += s.FsyncFailures
	t.Partitions += s.Partitions
	t.ClockJumps += s.ClockJumps
	t.Moves += s.Moves
	t.MoveOrders += s.MoveOrders
	t.MovesDone += s.MovesDone
	t.SplitsDone += s.SplitsDone
	t.Ops += s.Ops
	t.OpsAcked += s.OpsAcked
	t.OpsGaveUp += s.OpsGaveUp
	t.Batches += s.Batches
	t.BatchedCreates += s.BatchedCreates
	t.BatchFallbacks += s.BatchFallbacks
	t.Fires += s.Fires
	t.Executions += s.Executions
	t.Retries += s.Retries
	t.DeadLetters += s.DeadLetters
	t.Recoveries += s.Recoveries
	t.Snapshots += s.Snapshots
	t.SnapshotsLoaded += s.SnapshotsLoaded
	t.StaleResults += s.StaleResults
	t.NoRoomRefusals += s.NoRoomRefusals
}

// TestSweepLongArm runs 200 seeds with the shards arming fires 500 ms ahead: most
// periodic jobs then have a period no longer than ArmMs, and commands for jobs with
// armed runs, parked until those go, are common (at 5 ms they are rare). Before
// armed.go stopped arming ahead a job with a parked command, 20 of 1,000 such seeds
// made no progress.
func TestSweepLongArm(t *testing.T) {
	results := runSeeds(200, func(i int) Config {
		cfg := DefaultConfig(20_000 + uint64(i))
		cfg.ArmMs = 500
		return cfg
	})
	failed := 0
	for _, r := range results {
		if f := r.Failure; f != nil {
			if _, ok := knownBugs[f.Invariant]; ok {
				continue
			}
			t.Errorf("arm 500: %s", f.Error())
			if failed++; failed >= 3 {
				t.Fatalf("stopping after %d failures", failed)
			}
		}
	}
}

// TestMutationsCaught switches on each deliberate bug of the shard core and shows
// the invariants catch it within mutationBound seeds. A harness that never fails
// proves nothing.
func TestMutationsCaught(t *testing.T) {
	cases := []struct {
		name   string
		m      shardcore.Mutations
		want   []string // the invariants that may catch it
		bound  int      // seeds it may survive (mutationBound if 0)
		noLazy bool     // shards sync every step at once (LazySyncMs 0)
	}{
		{"ack-before-durable", shardcore.Mutations{AckBeforeDurable: true}, []string{"acked-job-lost", "resurrected", "resurrected-by-late-create", "fire-after-delete", "version-regressed"}, 0, false},
		// A stale owner's result must outlive a handoff and a move straight back, and
		// meet its run still waiting at the same attempt: 12 seeds of the first 2,000
		// (seed 905 first; 8 of 2,000 and seed 21 first without lazy syncs).
		{"skip-epoch-check", shardcore.Mutations{SkipEpochCheck: true}, []string{"epoch-fencing"}, 1000, false},
		{"skip-epoch-check, no lazy syncs", shardcore.Mutations{SkipEpochCheck: true}, []string{"epoch-fencing"}, 200, true},
		{"fire-early=1", shardcore.Mutations{FireEarlyMs: 1}, []string{"early-fire"}, 0, false},
		{"forget-retry-record", shardcore.Mutations{ForgetRetryRecord: true}, []string{"journal-mismatch"}, 0, false},
		// A read, pause, resume or delete refused on a full disk (Config.DiskFull):
		// 33 of the first 100 seeds catch it, seed 1 first.
		{"refuse-all-no-room", shardcore.Mutations{RefuseAllNoRoom: true}, []string{"call-refused"}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first, caught := 0, 0
			byInv := map[string]int{}
			bound := tc.bound
			if bound == 0 {
				bound = mutationBound
			}
			for seed := 1; seed <= bound; seed++ {
				cfg := DefaultConfig(uint64(seed))
				cfg.Mutations = tc.m
				if tc.noLazy {
					cfg.LazySyncMs = 0
				}
				f := Run(cfg).Failure
				if f == nil {
					continue
				}
				if _, ok := knownBugs[f.Invariant]; ok {
					continue
				}
				if !contains(tc.want, f.Invariant) {
					t.Errorf("seed %d: caught by %s, not one of %v (a bug elsewhere?):\n%s", seed, f.Invariant, tc.want, f.Error())
					continue
				}
				caught++
				byInv[f.Invariant]++
				if first == 0 {
					first = seed
					t.Logf("first caught by seed %d: %s: %s", seed, f.Invariant, f.Message)
				}
				if testing.Short() {
					break
				}
			}
			if first == 0 {
				t.Fatalf("mutation %s survived %d seeds", tc.name, bound)
			}
			t.Logf("mutation %s: caught first after %d seeds; by %d of %d seeds %v", tc.name, first, caught, bound, byInv)
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestRegressions replays the seeds in testdata/regressions.txt: each must end as
// recorded ("ok", or the invariant a known bug or mutation breaks).
func TestRegressions(t *testing.T) { regressions(t, false) }

// TestRegressionsArmed replays the seeds that must pass again with the shards
// arming their fires (DefaultArmMs) and syncing lazily (DefaultLazySyncMs), as
// nodes run: another scenario each, where a fixed bug must stay fixed too.
func TestRegressionsArmed(t *testing.T) { regressions(t, true) }

func regressions(t *testing.T, armed bool) {
	f, err := os.Open("testdata/regressions.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		cfg, want, err := parseRegression(fields)
		if err != nil {
			t.Fatalf("regressions.txt:%d: %v", line, err)
		}
		if armed {
			if want != "ok" || cfg.ArmMs != 0 {
				continue // a caught bug or mutation is a scenario of its own harness
			}
			cfg.ArmMs, cfg.LazySyncMs = shardcore.DefaultArmMs, shardcore.DefaultLazySyncMs
		}
		r := Run(cfg)
		got := "ok"
		if r.Failure != nil {
			got = r.Failure.Invariant
		} else {
			for _, k := range r.Known {
				if k.Invariant == want {
					got = want
				}
			}
		}
		if got != want {
			msg := fmt.Sprintf("regressions.txt:%d: seed %d (%s, arm %d) ended %s, recorded as %s", line, cfg.Seed, strings.Join(fields[2:], " "), cfg.ArmMs, got, want)
			if r.Failure != nil {
				msg += "\n" + r.Failure.Error()
			}
			if want != "ok" {
				msg += "\n(a known bug that no longer reproduces: fixed? Or the harness changed and the seed is another scenario now.)"
			}
			t.Error(msg)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// parseRegression reads "seed expect [faults=…] [quirks=…] [mutate=…] [balance]…".
func parseRegression(fields []string) (Config, string, error) {
	if len(fields) < 2 {
		return Config{}, "", fmt.Errorf("want: seed expect [faults=…] [quirks=…] [mutate=…]")
	}
	seed, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil {
		return Config{}, "", fmt.Errorf("seed %q: %v", fields[0], err)
	}
	cfg := DefaultConfig(seed)
	// Lines without arm= were found before shards armed fires (Config.ArmMs), and
	// replay the harness they were found with.
	cfg.ArmMs = 0
	cfg.LazySyncMs = 0    // (and before lazy syncs: lazy=)
	cfg.Batches = false   // (and before the clients' create batches: batch)
	cfg.Snapshots = false // (and before snapshots were simulated: snap)
	cfg.DiskFull = false  // (and before full disks were: full)
	for _, opt := range fields[2:] {
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "faults":
			cfg.Faults, err = ParseFaults(v)
		case "quirks":
			cfg.Quirks, err = ParseQuirks(v)
		case "mutate":
			err = ParseMutation(v, &cfg.Mutations)
		case "arm":
			cfg.ArmMs, err = strconv.ParseInt(v, 10, 64)
		case "lazy":
			cfg.LazySyncMs, err = strconv.ParseInt(v, 10, 64)
		case "batch":
			cfg.Batches = true
		case "snap":
			cfg.Snapshots = true
		case "full":
			cfg.DiskFull = true
		case "balance": // a long run with the balance check (as TestBalanceAfterFaults)
			cfg.DurationMs, cfg.HealMs, cfg.CheckBalance = BalanceRunMs, BalanceHealMs, true
		default:
			err = fmt.Errorf("unknown option %q", opt)
		}
		if err != nil {
			return Config{}, "", err
		}
	}
	return cfg, fields[1], nil
}

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Fault
	}{
		{"all", AllFaults}, {"none", 0}, {"", 0}, {"loss,crash", FaultLoss | FaultCrash},
		{"all,-move", AllFaults &^ FaultMove}, {" Loss , DUP ", FaultLoss | FaultDup},
	} {
		got, err := ParseFaults(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFaults(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := ParseFaults(got.String()); err != nil || back != got {
			t.Errorf("ParseFaults(%q.String() = %q) = %v, %v", tc.in, got.String(), back, err)
		}
	}
	if _, err := ParseFaults("loss,bogus"); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("ParseFaults(bogus) error = %v, want one naming it", err)
	}
}

// TestStepsReproduce shows --steps stops a failing run exactly at its failure.
func TestStepsReproduce(t *testing.T) {
	cfg := DefaultConfig(1)
	cfg.Mutations.FireEarlyMs = 1
	f := Run(cfg).Failure
	if f == nil {
		t.Fatal("mutated seed 1 did not fail")
	}
	cfg.Steps = f.Step
	g := Run(cfg).Failure
	if g == nil || g.Step != f.Step || g.Message != f.Message {
		t.Fatalf("replay with --steps %d: %v, want the same failure as %v", f.Step, g, f)
	}
	if !strings.Contains(f.Error(), "kjob sim --seed 1 --faults all --mutate fire-early=1 --steps") {
		t.Errorf("failure report lacks its replay command:\n%s", f.Error())
	}
}

// balanceSeeds is how many seeds TestBalanceAfterFaults runs (each a 120 s run).
const balanceSeeds = 40

// TestBalanceAfterFaults runs long runs with every fault for their first 20 s and
// checks, besides every other invariant, that the NameServer's strategy has no
// move left on its final picture: the balance is back within the strategy's
// bound (highest server at most twice the lowest, or no move that narrows the gap).
func TestBalanceAfterFaults(t *testing.T) {
	n := balanceSeeds
	if testing.Short() {
		n = 8
	}
	start := time.Now()
	var total Stats
	results := runSeeds(n, func(i int) Config {
		c := DefaultConfig(*sweepFrom + uint64(i))
		c.DurationMs, c.HealMs, c.CheckBalance = BalanceRunMs, BalanceHealMs, true
		return c
	})
	failed := 0
	for _, r := range results {
		add(&total, r.Stats)
		if f := r.Failure; f != nil {
			failed++
			t.Errorf("%s", f.Error())
			if failed >= 100 {
				t.Fatalf("stopping after %d failures", failed)
			}
		}
	}
	t.Logf("%d balance runs in %v: %d moves done (%d ordered by the NameServer), %d splits",
		n, time.Since(start).Round(time.Millisecond), total.MovesDone, total.MoveOrders, total.SplitsDone)
}
