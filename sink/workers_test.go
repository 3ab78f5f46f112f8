package sink_test

import (
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// A heartbeat inserts the member's row, then moves its seen_at on the
// database's clock and keeps started_at; Workers reads a group's rows with
// that clock; ForgetWorker and PruneWorkers delete rows, of their group
// only.
func TestWorkerHeartbeats(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ws, now, err := e.store.Workers(e.ctx, "g")
	if err != nil || len(ws) != 0 || now.IsZero() {
		t.Fatalf("no rows yet: %v, clock %v, err %v", ws, now, err)
	}
	a := sink.Worker{Group: "g", MemberID: "A", ClientID: "tenure-a", Host: "host-a", PID: 11}
	for _, w := range []sink.Worker{a, {Group: "g", MemberID: "B", ClientID: "tenure-b", Host: "host-b", PID: 12},
		{Group: "other", MemberID: "A", ClientID: "x", Host: "y", PID: 1}} {
		if err := e.store.Heartbeat(e.ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	first, _, err := e.store.Workers(e.ctx, "g")
	if err != nil || len(first) != 2 || first[0].MemberID != "A" || first[1].MemberID != "B" {
		t.Fatalf("group g: %+v, %v", first, err)
	}
	if w := first[0]; w.ClientID != "tenure-a" || w.Host != "host-a" || w.PID != 11 || w.Group != "g" || !w.StartedAt.Equal(w.SeenAt) {
		t.Errorf("A's first row: %+v", w)
	}

	time.Sleep(20 * time.Millisecond)
	a.PID = 13 // the same member id from another process cannot happen, but the row follows what it is told
	if err := e.store.Heartbeat(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	again, now, err := e.store.Workers(e.ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	w := again[0]
	if !w.StartedAt.Equal(first[0].StartedAt) || !w.SeenAt.After(first[0].SeenAt) || w.PID != 13 {
		t.Errorf("a second beat moves seen_at only: was %+v, now %+v", first[0], w)
	}
	if now.Before(w.SeenAt) {
		t.Errorf("the clock read with the rows (%v) is before the latest beat (%v)", now, w.SeenAt)
	}

	// B has not beaten for a while: pruned; A stays; the other group too.
	if _, err := e.pool.Exec(e.ctx, `UPDATE `+e.q()+`.workers SET seen_at = now() - interval '2 days' WHERE member_id = 'B'`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.PruneWorkers(e.ctx, "g", 24*time.Hour); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	if gone, err := e.store.ForgetWorker(e.ctx, "g", "A"); err != nil || !gone {
		t.Fatalf("forgetting A: %v %v", gone, err)
	}
	if gone, err := e.store.ForgetWorker(e.ctx, "g", "A"); err != nil || gone {
		t.Fatalf("forgetting A twice: %v %v", gone, err)
	}
	if ws, _, _ := e.store.Workers(e.ctx, "g"); len(ws) != 0 {
		t.Errorf("group g still has %+v", ws)
	}
	if ws, _, _ := e.store.Workers(e.ctx, "other"); len(ws) != 1 {
		t.Errorf("group other: %+v", ws)
	}
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "g"}); err == nil {
		t.Error("a heartbeat without a member id was accepted")
	}
}

// A heartbeat records the member's epoch (migration 018), and a later one
// replaces it; Workers reads it. On a schema before 018 (the admin
// commands read schemas they do not migrate) Workers reads the rows
// without epochs, and a heartbeat still lands.
func TestWorkerEpochs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	gen := int32(3)
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "g", MemberID: "A", ClientID: "c", Host: "h", PID: 1, Epoch: &gen}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "g", MemberID: "B", ClientID: "c", Host: "h", PID: 2}); err != nil {
		t.Fatal(err)
	}
	ws, _, err := e.store.Workers(e.ctx, "g")
	if err != nil || len(ws) != 2 || ws[0].Epoch == nil || *ws[0].Epoch != 3 || ws[1].Epoch != nil {
		t.Fatalf("rows %+v, %v; want A at epoch 3, B without one", ws, err)
	}
	gen = 4
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "g", MemberID: "A", ClientID: "c", Host: "h", PID: 1, Epoch: &gen}); err != nil {
		t.Fatal(err)
	}
	if ws, _, err := e.store.Workers(e.ctx, "g"); err != nil || *ws[0].Epoch != 4 {
		t.Fatalf("after a beat at epoch 4: %+v, %v", ws, err)
	}

	migrateBelow(t, e.ctx, e.pool, e.schema, 17)
	ws, now, err := e.store.Workers(e.ctx, "g")
	if err != nil || len(ws) != 2 || ws[0].Epoch != nil || ws[0].PID != 1 || now.IsZero() {
		t.Fatalf("Workers on a schema before 018: %+v, %v", ws, err)
	}
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "g", MemberID: "C", ClientID: "c", Host: "h", PID: 5, Epoch: &gen}); err != nil {
		t.Fatalf("a heartbeat on a schema before 018: %v", err)
	}
	if ws, _, err := e.store.Workers(e.ctx, "g"); err != nil || len(ws) != 3 {
		t.Fatalf("after C's beat on a schema before 018: %+v, %v", ws, err)
	}
}
