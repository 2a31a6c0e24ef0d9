package worker

import (
	"context"
	"testing"
)

// BenchmarkRun is a worker's own cost of one run around a handler that does nothing
// (its Run, context, result and the context's timer), without the actor.
func BenchmarkRun(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    HandlerFunc
	}{
		{"noop", func(context.Context, *Run) error { return nil }},
		{"done", func(ctx context.Context, _ *Run) error { _ = ctx.Done(); return nil }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a, task := testActor(bc.h)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				a.run(task)
			}
		})
	}
}
