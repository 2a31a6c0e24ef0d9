package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// barOut is where progress goes (stderr; io.Discard with --quiet).
var barOut io.Writer = os.Stderr

// bar is a one-line progress bar redrawn with \r; a nil *bar is a no-op.
type bar struct {
	label string
	total int64
	done  atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newBar(label string, total int) *bar {
	b := &bar{label: label, total: int64(total), start: time.Now(), stop: make(chan struct{})}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				b.draw()
			}
		}
	}()
	return b
}

func (b *bar) add(n int64) {
	if b != nil {
		b.done.Add(n)
	}
}

func (b *bar) draw() {
	const width = 30
	d := b.done.Load()
	el := time.Since(b.start).Seconds()
	f := 0.0
	if b.total > 0 {
		f = min(float64(d)/float64(b.total), 1)
	}
	fill := int(f * width)
	fmt.Fprintf(barOut, "\r%-34s [%s%s] %3.0f%% %d/%d %s/s %6.1fs", b.label, strings.Repeat("#", fill),
		strings.Repeat(".", width-fill), f*100, d, b.total, fmtNum(float64(d)/max(el, 1e-9)), el)
}

func (b *bar) finish() {
	if b == nil {
		return
	}
	close(b.stop)
	b.wg.Wait()
	b.draw()
	fmt.Fprintln(barOut)
}
