package consumer

import "testing"

// A strict offset commit's metadata names the batch and carries the log
// epoch the divergence check reads (mirroredBy); other metadata names no
// batch.
func TestStrictMetadata(t *testing.T) {
	gid := "t1.0123456789abcdef0123456789abcdef.3.0.7.42.100.150"
	m := strictMetadata(5, gid)
	if got := strictGIDOf(m); got != gid {
		t.Errorf("strictGIDOf(%q) = %q", m, got)
	}
	if e, ok := mirroredBy(m); !ok || e != 5 {
		t.Errorf("mirroredBy(%q) = %d, %v; want 5, true", m, e, ok)
	}
	if len(m) > 4096 {
		t.Errorf("metadata of %d bytes is above Kafka's offset.metadata.max.bytes", len(m))
	}
	for _, other := range []string{"", mirrorMetadata(5), "someone else strict=" + gid} {
		if got := strictGIDOf(other); got != "" {
			t.Errorf("strictGIDOf(%q) = %q, want none", other, got)
		}
	}
}
