package consumer

import (
	"testing"

	"github.com/tenure-dev/tenure/internal/fence"
)

// A lane's committer comes from the Config, once: the commit path itself
// never asks which mode the worker runs in.
func TestCommitterChosenFromConfig(t *testing.T) {
	t.Parallel()
	store := idleStore(t, "postgres://127.0.0.1:1/none") // never connects
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
