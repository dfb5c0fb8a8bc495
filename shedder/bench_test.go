package shedder_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/shedder"
)

func BenchmarkWorkerAdmit(b *testing.B) {
	w, err := shedder.NewWorker(1<<30, shedder.WorkerSettings{})
	if err != nil {
		b.Fatal(err)
	}
	benchAdmit(b, w)
}

// Admit never touches Redis; Refresh is one script round trip.
func BenchmarkFleet(b *testing.B) {
	srv := redistest.Start(b)
	f, err := shedder.NewFleet(srv.Client(b), "bench", 1<<30, shedder.FleetSettings{Timeout: time.Second}.With(shedder.Knobs{NoAutoRefresh: true}))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := f.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	b.Run("admit", func(b *testing.B) {
		r := spillway.Request{Priority: spillway.Critical}
		b.ReportAllocs()
		for b.Loop() {
			_, done, _ := f.Admit(ctx, &r)
			done(spillway.Success)
		}
	})
	b.Run("refresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := f.Refresh(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Queue.Admit with a free slot (no wait) + done, beside Worker.Admit.
func BenchmarkQueueAdmit(b *testing.B) {
	q, err := shedder.NewQueue(1<<30, shedder.QueueSettings{})
	if err != nil {
		b.Fatal(err)
	}
	benchAdmit(b, q)
}

// benchAdmit measures Admit + done of one Critical request with room to
// spare, serially and from every CPU.
func benchAdmit(b *testing.B, l spillway.Limiter) {
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		r := spillway.Request{Priority: spillway.Critical}
		b.ReportAllocs()
		for b.Loop() {
			_, done, _ := l.Admit(ctx, &r)
			done(spillway.Success)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := spillway.Request{Priority: spillway.Critical}
			for pb.Next() {
				_, done, _ := l.Admit(ctx, &r)
				done(spillway.Success)
			}
		})
	})
}

// Pool.Admit + done, one request at a time (so a slot is always free
// whatever the limit learned), beside Queue.Admit: the cost of learning
// (the sample, the Overdue scan, the resize) on top of the queue.
func BenchmarkPoolAdmit(b *testing.B) {
	lim, err := concurrency.NewLatencyLimit(concurrency.LatencyConfig{})
	if err != nil {
		b.Fatal(err)
	}
	p, err := shedder.NewPool(lim, nil, shedder.QueueSettings{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	r := spillway.Request{Priority: spillway.Critical}
	b.ReportAllocs()
	for b.Loop() {
		_, done, _ := p.Admit(ctx, &r)
		done(spillway.Success)
	}
}
