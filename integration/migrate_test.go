package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// `tenure migrate down` on a schema whose fencing state is in use refuses,
// saying what would be lost, and reverts nothing; --force reverts and says
// what it dropped.
func TestCLIMigrateDownRefusesWhileFencing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.claimed(sink.Token{Epoch: 1})
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	newest := sink.Migrations()[len(sink.Migrations())-1]
	name := fmt.Sprintf("%03d_%s", newest.Version, newest.Name)
	wantFailure(t, runCLI(t, 30*time.Second, "", append([]string{"migrate", "down"}, db...)...), 1,
		"refusing to revert migration "+name, "1 fencing rows", "0 dead letters", "0 incarnations", "1 fence log entries",
		"--force` if that loss is intended")
	r := runCLI(t, 30*time.Second, "", append([]string{"migrate", "status"}, db...)...)
	if r.code != 0 || strings.Contains(r.stdout, "pending") {
		t.Fatalf("a refused migrate down reverted something: %s", r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"migrate", "down", "--force"}, db...)...)
	want := fmt.Sprintf("reverted migration %03d of schema %s", newest.Version, e.schema)
	if d := newest.Drops(); len(d) > 0 {
		want += " (dropped " + strings.Join(d, ", ") + ")"
	}
	if r.code != 0 || strings.TrimSpace(r.stdout) != want {
		t.Fatalf("migrate down --force: %s", r)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", append([]string{"migrate", "up", "--force"}, db...)...), 2, "--force goes with down")
}
