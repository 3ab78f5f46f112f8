package consumer

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// A lane's committer comes from the Config, once: the commit path itself
// never asks which mode the worker runs in.
func TestCommitterChosenFromConfig(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := sink.NewStore(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want committer
	}{
		{"fenced", Config{}, fencedCommitter{}},
		{"strict", Config{Strict: true}, strictCommitter{}},
		{"unfenced", Config{UnsafeNoFence: true}, unfencedCommitter{}},
	} {
		if got := newCommitter(&Consumer{cfg: c.cfg, store: fence.Of(store)}); got != c.want {
			t.Errorf("%s: newCommitter = %#v, want %#v", c.name, got, c.want)
		}
	}
}
