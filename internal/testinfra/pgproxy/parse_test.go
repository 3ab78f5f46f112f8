package pgproxy

import (
	"encoding/binary"
	"testing"
)

func message(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

func TestIsCommit(t *testing.T) {
	for _, c := range []struct {
		msg  []byte
		want bool
	}{
		{message('Q', "commit\x00"), true},
		{message('Q', "COMMIT\x00"), true},
		{message('Q', " Commit ; \x00"), true},
		{message('Q', "rollback\x00"), false},
		{message('Q', "commit prepared 'x'\x00"), false},
		{message('Q', "select 'commit'\x00"), false},
		{message('P', "\x00commit\x00\x00\x00"), false}, // a Parse prepares, it does not run
	} {
		var cn conn
		if got := cn.isCommit(c.msg); got != c.want {
			t.Errorf("isCommit(%q) = %v, want %v", c.msg, got, c.want)
		}
	}
}

// Extended protocol: a Bind runs the statement a Parse prepared, named or
// unnamed, and the name may be reused for another statement.
func TestIsCommitExtended(t *testing.T) {
	var cn conn
	steps := []struct {
		msg  []byte
		want bool
	}{
		{message('P', "s1\x00COMMIT\x00\x00\x00"), false},
		{message('P', "s2\x00select 1\x00\x00\x00"), false},
		{message('B', "\x00s2\x00\x00\x00\x00\x00\x00\x00"), false},
		{message('B', "\x00s1\x00\x00\x00\x00\x00\x00\x00"), true},
		{message('P', "\x00commit\x00\x00\x00"), false},
		{message('B', "\x00\x00\x00\x00\x00\x00\x00\x00"), true},
		{message('P', "s1\x00select 2\x00\x00\x00"), false}, // s1 reused
		{message('B', "\x00s1\x00\x00\x00\x00\x00\x00\x00"), false},
	}
	for i, st := range steps {
		if got := cn.isCommit(st.msg); got != st.want {
			t.Errorf("step %d: isCommit(%q) = %v, want %v", i, st.msg, got, st.want)
		}
	}
}

// The reply is parsed once complete, whatever the reads cut it into.
func TestCommandTag(t *testing.T) {
	notice := message('N', "Sx\x00")
	reply := append(append(notice, message('C', "COMMIT\x00")...), message('Z', "I")...)
	for i := range len(reply) {
		tag, ok := commandTag(reply[:i])
		if ok && i < len(notice)+len(message('C', "COMMIT\x00")) {
			t.Fatalf("complete after %d bytes: %q", i, tag)
		}
	}
	if tag, ok := commandTag(reply); !ok || tag != "COMMIT" {
		t.Fatalf("got %q %v, want COMMIT", tag, ok)
	}
	// In a pipeline, the results of statements before the COMMIT come first.
	pipelined := append(append(message('C', "SELECT 1\x00"), message('C', "COMMIT\x00")...), message('Z', "I")...)
	if tag, ok := commandTag(pipelined); !ok || tag != "COMMIT" {
		t.Fatalf("pipelined: got %q %v, want COMMIT", tag, ok)
	}
	if tag, ok := commandTag(message('E', "SERROR\x00\x00")); !ok || tag != "error" {
		t.Fatalf("got %q %v, want error", tag, ok)
	}
}
