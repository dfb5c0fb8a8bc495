package shedder_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestSettingsMisuseDoesNotCompile: each constructor takes its own
// settings struct, so a setting of another constructor (a Fleet's
// Reservations on a Worker, a Queue's MaxWait on a Fleet, a Worker's
// Sources on a Queue) or another constructor's settings is a compile
// error, never silently ignored; the right settings compile.
func TestSettingsMisuseDoesNotCompile(t *testing.T) {
	for _, c := range []struct{ code, want string }{
		{`_, _ = shedder.NewWorker(10, shedder.WorkerSettings{Reservations: true})`, "unknown field Reservations"},
		{`_, _ = shedder.NewFleet(nil, "f", 10, shedder.FleetSettings{MaxWait: time.Second})`, "unknown field MaxWait"},
		{`_, _ = shedder.NewQueue(4, shedder.QueueSettings{Sources: nil})`, "unknown field Sources"},
		{`_, _ = shedder.NewPool(nil, nil, shedder.WorkerSettings{})`, "cannot use"},
		{`_, _ = shedder.NewCapacityWatcher(nil, nil, nil, shedder.FleetSettings{Interval: time.Second})`, "cannot use"},
		{`_, _ = shedder.NewWorker(10, shedder.WorkerSettings{Reserve: 0.1}.With(shedder.Knobs{}))`, "With undefined"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: c.code + "\n"})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: errors %q, want one containing %q", c.code, errs, c.want)
		}
	}
	ok := `_, _ = shedder.NewWorker(10, shedder.WorkerSettings{Reserve: 0.1})
_, _ = shedder.NewQueue(4, shedder.QueueSettings{MaxWait: time.Second})
_, _ = shedder.NewPool(nil, nil, shedder.QueueSettings{Depth: 8})
_, _ = shedder.NewFleet(nil, "f", 10, shedder.FleetSettings{Reservations: true})
_, _ = shedder.NewCapacityWatcher(nil, nil, nil, shedder.WatcherSettings{Interval: time.Second})`
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok + "\n"}); len(errs) > 0 {
		t.Errorf("the right settings do not compile: %q", errs)
	}
}
