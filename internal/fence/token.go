package fence

import (
	"fmt"
	"strconv"
	"strings"
)

// Token is a fencing token: the consumer group's ownership epoch (the classic
// protocol's generation, or the KIP-848 member epoch at which the partition
// was assigned), led by an incarnation.
//
// The incarnation exists because epochs are not forever monotonic: deleting a
// consumer group, or letting an empty one expire, restarts generations at 1.
// Tokens compare incarnation first, then epoch.
type Token struct {
	Incarnation int64
	Epoch       int32
}

// Less reports whether t is older than u.
func (t Token) Less(u Token) bool {
	if t.Incarnation != u.Incarnation {
		return t.Incarnation < u.Incarnation
	}
	return t.Epoch < u.Epoch
}

// String renders the token as "incarnation.epoch", e.g. "0.82".
func (t Token) String() string {
	return strconv.FormatInt(t.Incarnation, 10) + "." + strconv.FormatInt(int64(t.Epoch), 10)
}

// ParseToken parses the form written by String.
func ParseToken(s string) (Token, error) {
	inc, ep, ok := strings.Cut(s, ".")
	if !ok {
		return Token{}, fmt.Errorf("token %q is not of the form incarnation.epoch", s)
	}
	i, err := strconv.ParseInt(inc, 10, 64)
	if err != nil || i < 0 {
		return Token{}, fmt.Errorf("token %q has a bad incarnation", s)
	}
	e, err := strconv.ParseInt(ep, 10, 32)
	if err != nil {
		return Token{}, fmt.Errorf("token %q has a bad epoch", s)
	}
	t := Token{Incarnation: i, Epoch: int32(e)}
	if t.String() != s { // no signs, no leading zeros: one spelling per token
		return Token{}, fmt.Errorf("token %q is not in canonical form (want %q)", s, t.String())
	}
	return t, nil
}

// Partition names one fenced unit of work.
type Partition struct {
	Group     string
	Topic     string
	Partition int32
}

func (p Partition) String() string {
	return fmt.Sprintf("%s/%s/%d", p.Group, p.Topic, p.Partition)
}
