package cli

import "testing"

func TestForText(t *testing.T) {
	for sec, want := range map[int64]string{0: "0s", 42: "42s", 60: "1m00s", 190: "3m10s", 3600: "1h00m", 7500: "2h05m", 47*3600 + 59*60: "47h59m", 3 * 86400: "3d"} {
		if got := forText(&sec); got != want {
			t.Errorf("forText(%d) = %q, want %q", sec, got, want)
		}
	}
	if got := forText(nil); got != "-" {
		t.Errorf("forText(nil) = %q", got)
	}
}
