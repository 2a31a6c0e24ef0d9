package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/actors/kerr"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/sim"
)

// simCmd is `kjob sim`: run the deterministic simulation of a whole cluster for a
// seed (or a range of seeds) and report the first broken invariant. A failure
// prints the exact command that replays it.
func simCmd() *cobra.Command {
	var (
		armMs, lazyMs    int64
		seed             uint64
		seeds            int
		steps            int64
		faults, quirks   string
		mutate           []string
		trace            bool
		duration, healAt time.Duration
		tailLines        int
		checkBalance     bool
		batches          bool
		snapshots        bool
		diskFull         bool
	)
	c := &cobra.Command{
		Use:   "sim",
		Short: "run the deterministic cluster simulation for a seed and check its invariants",
		Long: `Runs servers, shards, the NameServer, workers and clients in one thread under a
seeded fault generator (loss, duplication, reordering, partitions, crashes, torn
journals, failed fsyncs, clock jumps, slow nodes, shard handoffs), checking the
invariants as it goes. The same seed and flags replay the same run exactly; a
failure prints its seed, step, the tail of its trace and the command to replay it.

  kjob sim --seed 42                    one run, summary
  kjob sim --seed 42 --trace            and every event
  kjob sim --seed 1 --seeds 1000        a sweep of seeds 1..1000
  kjob sim --seed 7 --faults loss,crash --mutate fire-early=1
  kjob sim --seed 1 --seeds 100 --duration 120s --heal 20s --check-balance
                                        long runs that also check the balancer`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs, err := sim.ParseFaults(faults)
			if err != nil {
				return err
			}
			qs, err := sim.ParseQuirks(quirks)
			if err != nil {
				return err
			}
			if armMs < 0 {
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "arm-ms", Message: fmt.Sprintf("%d: must not be negative", armMs)}
			}
			if lazyMs < 0 {
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "lazy-sync-ms", Message: fmt.Sprintf("%d: must not be negative", lazyMs)}
			}
			base := sim.Config{Steps: steps, DurationMs: duration.Milliseconds(), HealMs: healAt.Milliseconds(),
				Faults: fs, Quirks: qs, TailLines: tailLines, CheckBalance: checkBalance, ArmMs: armMs, LazySyncMs: lazyMs, Batches: batches, Snapshots: snapshots, DiskFull: diskFull}
			for _, m := range mutate {
				if err := sim.ParseMutation(m, &base.Mutations); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			if seeds <= 1 {
				cfg := base
				cfg.Seed = seed
				if trace {
					cfg.Trace = out
				}
				r := sim.Run(cfg)
				printSimResult(out, r)
				if r.Failure != nil {
					return fmt.Errorf("seed %d: invariant %s broken", seed, r.Failure.Invariant)
				}
				return nil
			}
			start := time.Now()
			failed, noted := 0, 0
			for i := range seeds {
				cfg := base
				cfg.Seed = seed + uint64(i)
				r := sim.Run(cfg)
				if len(r.Known) > 0 {
					noted++
				}
				if r.Failure != nil {
					failed++
					fmt.Fprintf(out, "seed %d: %s: %s\n  replay: %s\n", cfg.Seed, r.Failure.Invariant, r.Failure.Message, r.Failure.ReplayCommand())
				}
			}
			d := time.Since(start)
			fmt.Fprintf(out, "%d seeds (%d..%d) in %v, %.0f seeds/s: %d failed, %d more met a known open bug and went on\n", seeds, seed, seed+uint64(seeds)-1,
				d.Round(time.Millisecond), float64(seeds)/d.Seconds(), failed, noted)
			if failed > 0 {
				return fmt.Errorf("%d of %d seeds broke an invariant", failed, seeds)
			}
			return nil
		},
	}
	c.Flags().Uint64Var(&seed, "seed", 1, "seed of the run (the first seed with --seeds)")
	c.Flags().IntVar(&seeds, "seeds", 1, "run this many consecutive seeds from --seed and list the failures")
	c.Flags().Int64Var(&steps, "steps", 0, "stop after this many events (0: run the whole duration); a failure prints its step")
	c.Flags().StringVar(&faults, "faults", "all", "faults to inject: all, none, or a list of loss,dup,delay,partition,crash,worker,client,disk,clock,slow,move (\"all,-move\" removes one)")
	c.Flags().StringSliceVar(&mutate, "mutate", nil, "switch on a deliberate shard-core bug: ack-before-durable, skip-epoch-check, fire-early[=ms], forget-retry-record, refuse-all-no-room")
	c.Flags().StringVar(&quirks, "quirks", "", "re-enable a known shell bug the simulated shells otherwise avoid: early-open")
	c.Flags().BoolVar(&trace, "trace", false, "print every trace line")
	c.Flags().DurationVar(&duration, "duration", 0, fmt.Sprintf("virtual length of the run (default %v)", time.Duration(sim.DefaultDurationMs)*time.Millisecond))
	c.Flags().DurationVar(&healAt, "heal", 0, "virtual time at which faults stop (default 55% of --duration)")
	c.Flags().BoolVar(&checkBalance, "check-balance", false, "also check that a move the NameServer's strategy wants is done within the bound once settled (for long runs, e.g. --duration 120s --heal 20s)")
	c.Flags().Int64Var(&armMs, "arm-ms", shardcore.DefaultArmMs, "shards journal a fire up to this many ms before its due and send it at the due (0: journal at the due)")
	c.Flags().Int64Var(&lazyMs, "lazy-sync-ms", shardcore.DefaultLazySyncMs, "shards let results' acks and armed fires wait this many ms for a shared fsync (0: every step syncs at once)")
	c.Flags().BoolVar(&batches, "batches", true, "clients send some creates in CreateJobs batches, as the Go client does (false: the harness before batches)")
	c.Flags().BoolVar(&diskFull, "disk-full", true, "with the disk fault, a server's disk is full now and then and its shards refuse new work (false: the harness before full disks)")
	c.Flags().BoolVar(&snapshots, "snapshots", true, "shards snapshot themselves every few records and recover from their newest snapshot (false: the harness before snapshots)")
	c.Flags().IntVar(&tailLines, "tail", 0, fmt.Sprintf("trace lines shown with a failure (default %d)", sim.DefaultTailLines))
	return c
}

func printSimResult(w io.Writer, r sim.Result) {
	s := r.Stats
	fmt.Fprintf(w, "seed %d: %s; %d events, %d ms virtual, trace hash %016x\n", r.Seed, r.Shape, r.Steps, r.EndMs, r.Hash)
	fmt.Fprintf(w, "  faults: %d msgs (%d dropped, %d duplicated), %d server / %d worker / %d client crashes, %d torn tails, "+
		"%d fsync failures, %d partitions, %d clock jumps, %d handoffs\n",
		s.Messages, s.Dropped, s.Duplicated, s.ServerCrashes, s.WorkerCrashes, s.ClientCrashes, s.TornTails,
		s.FsyncFailures, s.Partitions, s.ClockJumps, s.MovesDone)
	fmt.Fprintf(w, "  work: %d calls (%d acked, %d gave up; %d create batches of %d creates, %d creates then alone), %d creates, %d deletes, %d fires, %d executions, %d retries, "+
		"%d dead letters, %d recoveries (%d shards from a snapshot; %d snapshots written), %d calls refused on a full disk, max lateness once settled %d ms\n",
		s.Ops, s.OpsAcked, s.OpsGaveUp, s.Batches, s.BatchedCreates, s.BatchFallbacks, s.Creates, s.Deletes, s.Fires, s.Executions, s.Retries, s.DeadLetters, s.Recoveries, s.SnapshotsLoaded, s.Snapshots, s.NoRoomRefusals, s.MaxLateMs)
	for _, k := range r.Known {
		fmt.Fprintf(w, "  known open bug met (the run went on): %s at step %d (t=%d ms): %s\n", k.Invariant, k.Step, k.AtMs, k.Message)
	}
	if r.Failure != nil {
		fmt.Fprint(w, r.Failure.Error())
		return
	}
	fmt.Fprintln(w, "  every invariant held")
}
