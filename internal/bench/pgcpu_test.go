package bench

import "testing"

func TestParseBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got, err := parseBusy("cpu  1000 20 300 50000 400 5 60 7 0 0")
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(1000+20+300+5+60+7) / 100; got != want {
		t.Errorf("busy %v s, want %v (idle and iowait are not busy)", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 x 4 5 6 7 8", "cpu 1 2 3"} {
		if _, err := parseBusy(bad); err == nil {
			t.Errorf("parseBusy(%q): no error", bad)
		}
	}
}
