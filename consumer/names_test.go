package consumer

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestValidateTopic(t *testing.T) {
	for _, ok := range []string{"a", "jobs", "Jobs-2026_v1.x", "...", ".a", "a..b", "_", "-", strings.Repeat("t", MaxTopicLength)} {
		if err := ValidateTopic(ok); err != nil {
			t.Errorf("ValidateTopic(%q): %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"":                                    "empty",
		".":                                   `"." or ".."`,
		"..":                                  `"." or ".."`,
		strings.Repeat("t", MaxTopicLength+1): "at most 249",
		"a b":                                 "byte 2 is a space",
		"jobs,other":                          `byte 5 is ','`,
		"jobs/1":                              `'/'`,
		"tenüre":                              `'ü'`,
		"bad\xff":                             "0xff, not UTF-8",
		"x\x1b[31m":                           `'\x1b'`,
		"new\nline":                           `'\n'`,
		"g'; DROP TABLE x; --":                `'\''`,
	} {
		err := ValidateTopic(bad)
		if err == nil {
			t.Errorf("ValidateTopic(%q) accepted it", bad)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateTopic(%q) = %q, want it to say %q", bad, err, want)
		}
		if strings.ContainsAny(err.Error(), "\n\x1b\xff") {
			t.Errorf("ValidateTopic(%q) = %q: the message must be safe for a terminal", bad, err)
		}
	}
}

func TestValidateGroupAndClientID(t *testing.T) {
	for _, ok := range []string{"g", "workers", "workers'; DROP TABLE x; --\"", "gruppe-ü", "g\\x00", "a b", strings.Repeat("g", MaxNameLength)} {
		if err := ValidateGroup(ok); err != nil {
			t.Errorf("ValidateGroup(%q): %v", ok, err)
		}
		if err := ValidateClientID(ok); err != nil {
			t.Errorf("ValidateClientID(%q): %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"":                                   "consumer group name is empty",
		"   ":                                "consumer group name is empty",
		"bad\xff":                            "not valid UTF-8",
		"g\x00":                              `control character ('\x00' at byte 2)`,
		"g\x1b[31m":                          "control character",
		"two\nlines":                         "control character",
		"del\x7f":                            "control character",
		"c1\u0085":                           "control character",
		strings.Repeat("g", MaxNameLength+1): "at most 255",
	} {
		err := ValidateGroup(bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateGroup(%q) = %v, want it to say %q", bad, err, want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\n\x1b\xff\x00") {
			t.Errorf("ValidateGroup(%q) = %q: the message must be safe for a terminal", bad, err)
		}
		if err := ValidateClientID(bad); err == nil || !strings.HasPrefix(err.Error(), "client id") {
			t.Errorf("ValidateClientID(%q) = %v", bad, err)
		}
	}
}

// Config validation applies the same rules.
func TestConfigValidatesNames(t *testing.T) {
	base := func() Config {
		c := Config{Brokers: []string{"127.0.0.1:9092"}, Group: "g", Topics: []string{"t"},
			Store: nil, Handler: HandlerFunc(nil)}
		c.setDefaults()
		return c
	}
	for name, mutate := range map[string]func(*Config){
		"group":     func(c *Config) { c.Group = "g\xff" },
		"topic":     func(c *Config) { c.Topics = []string{"ok", "not ok"} },
		"client id": func(c *Config) { c.ClientID = "w\n1" },
	} {
		c := base()
		mutate(&c)
		err := c.validate()
		if err == nil || !strings.Contains(err.Error(), "not valid") && !strings.Contains(err.Error(), "control character") {
			t.Errorf("%s: validate() = %v", name, err)
		}
	}
}

// The validators never panic, and what they accept follows the rules.
func FuzzValidateNames(f *testing.F) {
	for _, s := range []string{"", ".", "..", "jobs", "a b", "bad\xff", "g\x00", "tenüre", strings.Repeat("x", 250)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateTopic(s); err == nil {
			if s == "" || s == "." || s == ".." || len(s) > MaxTopicLength {
				t.Fatalf("ValidateTopic accepted %q", s)
			}
			for i := 0; i < len(s); i++ {
				if !legalTopicByte(s[i]) {
					t.Fatalf("ValidateTopic accepted %q with byte %q", s, s[i])
				}
			}
		} else if !utf8.ValidString(err.Error()) {
			t.Fatalf("ValidateTopic(%q) error is not UTF-8: %q", s, err)
		}
		if err := ValidateGroup(s); err == nil {
			if !utf8.ValidString(s) || len(s) > MaxNameLength || strings.TrimSpace(s) == "" {
				t.Fatalf("ValidateGroup accepted %q", s)
			}
			for _, r := range s {
				if unicode.IsControl(r) {
					t.Fatalf("ValidateGroup accepted %q with %q", s, r)
				}
			}
		} else if !utf8.ValidString(err.Error()) || strings.ContainsAny(err.Error(), "\n\r\x1b\x00") {
			t.Fatalf("ValidateGroup(%q) error is not safe to print: %q", s, err)
		}
	})
}
