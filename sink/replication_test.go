package sink_test

import (
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

func TestReplicationSynchronous(t *testing.T) {
	for _, c := range []struct {
		r    sink.Replication
		sync bool
		says string
	}{
		{sink.Replication{SynchronousCommit: "on"}, false, "no standby"},
		{sink.Replication{SynchronousCommit: "on", Standbys: 1}, false, "1 asynchronous standby"},
		{sink.Replication{SynchronousStandbyNames: "*", SynchronousCommit: "on", Standbys: 1, SyncStandbys: 1}, true, "1 synchronous standby"},
		{sink.Replication{SynchronousStandbyNames: "*", SynchronousCommit: "local", Standbys: 1, SyncStandbys: 1}, false, "synchronous_commit local"},
		{sink.Replication{SynchronousStandbyNames: "*", SynchronousCommit: "off", Standbys: 1, SyncStandbys: 1}, false, "synchronous_commit off"},
		{sink.Replication{SynchronousStandbyNames: "*", SynchronousCommit: "remote_apply", Standbys: -1, SyncStandbys: -1}, true, "cannot be read"},
		{sink.Replication{SynchronousStandbyNames: "*", SynchronousCommit: "on"}, false, "no synchronous standby is connected"},
	} {
		if got := c.r.Synchronous(); got != c.sync {
			t.Errorf("%+v: Synchronous = %v, want %v", c.r, got, c.sync)
		}
		if d := c.r.Describe(); !strings.Contains(d, c.says) {
			t.Errorf("%+v: Describe = %q, want it to say %q", c.r, d, c.says)
		}
	}
}

// The test database is a single server: no standby.
func TestReplicationOfAStandaloneServer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r, err := sink.ReplicationOf(e.ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if r.Synchronous() || r.Standbys != 0 {
		t.Fatalf("a standalone server: %+v", r)
	}
}
