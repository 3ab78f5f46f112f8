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
		{message('P', "\x00commit\x00\x00\x00"), false}, // a Parse, not a Query
	} {
		if got := isCommit(c.msg); got != c.want {
			t.Errorf("isCommit(%q) = %v, want %v", c.msg, got, c.want)
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
	if tag, ok := commandTag(message('E', "SERROR\x00\x00")); !ok || tag != "error" {
		t.Fatalf("got %q %v, want error", tag, ok)
	}
}
