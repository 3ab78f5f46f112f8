package partition_test

import (
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/partition"
)

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int32{"1": 1, "3": 3, " 12 ": 12, "10000": partition.MaxCount} {
		got, err := partition.ParseCount(in)
		if err != nil || got != want {
			t.Errorf("ParseCount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"0":                    "between 1 and 10000",
		"-1":                   "between 1 and 10000",
		"10001":                "between 1 and 10000",
		"2147483647":           "between 1 and 10000",
		"4294967297":           "between 1 and 10000", // used to wrap to 1
		"4294967298":           "between 1 and 10000", // used to wrap to 2
		"99999999999999999999": "out of range",
		"3.5":                  "not a whole number",
		"0x10":                 "not a whole number",
		"":                     "not a whole number",
		"three":                "not a whole number",
	} {
		n, err := partition.ParseCount(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCount(%q) = %d, %v; want an error saying %q", in, n, err, want)
		}
	}
}

func FuzzParseCount(f *testing.F) {
	for _, s := range []string{"1", "10000", "4294967297", "-0", "+5", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := partition.ParseCount(s)
		if err == nil && (n < 1 || n > partition.MaxCount) {
			t.Fatalf("ParseCount(%q) = %d", s, n)
		}
	})
}
