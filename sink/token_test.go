package sink_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

func TestTokenStringParseRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tok sink.Token
		s   string
	}{
		{tok(0, 0), "0.0"},
		{tok(0, 82), "0.82"},
		{tok(1, 1), "1.1"},
		{tok(7, -1), "7.-1"}, // kgo reports generation -1 outside a group
		{tok(math.MaxInt64, math.MaxInt32), "9223372036854775807.2147483647"},
		{tok(0, math.MinInt32), "0.-2147483648"},
	} {
		if got := c.tok.String(); got != c.s {
			t.Errorf("%#v.String() = %q, want %q", c.tok, got, c.s)
		}
		got, err := sink.ParseToken(c.s)
		if err != nil || got != c.tok {
			t.Errorf("ParseToken(%q) = %#v, %v; want %#v", c.s, got, err, c.tok)
		}
	}
}

func TestParseTokenRejects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"", "82", ".", "0.", ".82", "a.b", "0.x", "x.0", "-1.5", "0.2147483648", "0.-2147483649",
		"9223372036854775808.1", "0.1.2", " 0.1", "0.1 ", "0,1", "0:1",
	} {
		if got, err := sink.ParseToken(s); err == nil {
			t.Errorf("ParseToken(%q) = %#v, want an error", s, got)
		}
	}
}

func TestTokenLess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b sink.Token
		want bool // a.Less(b)
	}{
		{tok(0, 81), tok(0, 82), true},
		{tok(0, 82), tok(0, 81), false},
		{tok(0, 82), tok(0, 82), false},
		{tok(0, 900), tok(1, 1), true}, // incarnation leads
		{tok(1, 1), tok(0, 900), false},
		{tok(1, 0), tok(1, 1), true},
		{tok(0, -1), tok(0, 0), true},
		{tok(2, math.MinInt32), tok(1, math.MaxInt32), false},
	} {
		if got := c.a.Less(c.b); got != c.want {
			t.Errorf("%s.Less(%s) = %v, want %v", c.a, c.b, got, c.want)
		}
		if c.want && c.b.Less(c.a) {
			t.Errorf("%s.Less(%s) and the reverse both hold", c.a, c.b)
		}
	}
}

// Less is the order Postgres uses for (incarnation, epoch): the claim
// statement compares row values, and a mismatch between the two would let
// the fence and the workers disagree about who is newer.
func TestTokenLessMatchesPostgres(t *testing.T) {
	t.Parallel()
	e := setup(t)
	toks := []sink.Token{tok(0, -1), tok(0, 0), tok(0, 81), tok(0, 82), tok(1, 0), tok(1, 1), tok(3, math.MinInt32), tok(3, math.MaxInt32)}
	for _, a := range toks {
		for _, b := range toks {
			var less bool
			if err := e.pool.QueryRow(e.ctx, `SELECT ($1::bigint, $2::integer) < ($3::bigint, $4::integer)`,
				a.Incarnation, a.Epoch, b.Incarnation, b.Epoch).Scan(&less); err != nil {
				t.Fatal(err)
			}
			if less != a.Less(b) {
				t.Errorf("%s < %s: Postgres says %v, Less says %v", a, b, less, a.Less(b))
			}
		}
	}
}

func TestPartitionString(t *testing.T) {
	t.Parallel()
	if got := (sink.Partition{Group: "g", Topic: "jobs", Partition: 7}).String(); got != "g/jobs/7" {
		t.Errorf("String() = %q", got)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"0.82", "1.1", "7.-1", "", "a.b", "0.1.2", "-1.5", "+1.2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tk, err := sink.ParseToken(s)
		if err != nil {
			return
		}
		if tk.Incarnation < 0 {
			t.Fatalf("ParseToken(%q) = %#v: negative incarnation", s, tk)
		}
		back, err := sink.ParseToken(tk.String())
		if err != nil || back != tk {
			t.Fatalf("ParseToken(%q) = %#v, whose String %q parses to %#v, %v", s, tk, tk.String(), back, err)
		}
	})
}

// Tokens order by incarnation first: after a generation reset (incarnation
// 1, epoch 1) every token of incarnation 0 is older, whatever its epoch.
func ExampleToken_Less() {
	tokens := []sink.Token{
		{Incarnation: 1, Epoch: 1},
		{Incarnation: 0, Epoch: 82},
		{Incarnation: 0, Epoch: 900},
		{Incarnation: 0, Epoch: 81},
	}
	slices.SortFunc(tokens, func(a, b sink.Token) int {
		switch {
		case a.Less(b):
			return -1
		case b.Less(a):
			return 1
		}
		return 0
	})
	fmt.Println(tokens)

	zombie, _ := sink.ParseToken("0.81")
	owner, _ := sink.ParseToken("0.82")
	fmt.Printf("%s is fenced by %s: %v\n", zombie, owner, zombie.Less(owner))
	// Output:
	// [0.81 0.82 0.900 1.1]
	// 0.81 is fenced by 0.82: true
}
