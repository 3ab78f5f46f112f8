package consumer

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxTopicLength is the longest topic name Kafka accepts (249 characters).
const MaxTopicLength = 249

// MaxNameLength bounds the other names tenure passes to Kafka and writes to
// Postgres: consumer groups and client ids (worker names), in bytes. Kafka
// itself sets no lower bound than its 32767-byte strings; 255 is a sane
// length for a name an operator types and reads in a table.
const MaxNameLength = 255

// ValidateTopic checks a topic name with Kafka's own rules: 1 to 249
// characters, each a letter a-z or A-Z, a digit, '.', '_' or '-', and not
// "." or "..". A name that breaks them is refused by every broker; refusing
// it before connecting says why.
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return errors.New("topic name is empty")
	case topic == "." || topic == "..":
		return fmt.Errorf("topic name %q is not valid: Kafka does not allow \".\" or \"..\"", topic)
	case len(topic) > MaxTopicLength:
		return fmt.Errorf("topic name %q is not valid: it is %d characters long, Kafka allows at most %d", abbreviateName(topic), len(topic), MaxTopicLength)
	}
	for i := 0; i < len(topic); i++ {
		if c := topic[i]; !legalTopicByte(c) {
			return fmt.Errorf("topic name %q is not valid: Kafka allows only letters a-z and A-Z, digits, '.', '_' and '-' (byte %d is %s)",
				abbreviateName(topic), i+1, describeByte(topic, i))
		}
	}
	return nil
}

func legalTopicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// describeByte names the byte at i of s for an error message, safely for a
// terminal.
func describeByte(s string, i int) string {
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && n <= 1:
		return fmt.Sprintf("0x%02x, not UTF-8", s[i])
	case r == ' ':
		return "a space"
	case unicode.IsPrint(r):
		return fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf("%+q", r)
}

// ValidateGroup checks a consumer group name: 1 to 255 bytes of valid
// UTF-8 without control characters, and not only spaces. Kafka accepts more,
// but tenure writes the group into Postgres text columns (which refuse
// invalid UTF-8) and prints it in tables and logs.
func ValidateGroup(group string) error { return validateName("consumer group name", group) }

// ValidateClientID checks a client id (a worker's name) with the rules of
// ValidateGroup: the coordinator builds member ids from it, and the member id
// is the owner Postgres records.
func ValidateClientID(id string) error { return validateName("client id", id) }

func validateName(what, s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is empty", what)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %q is not valid UTF-8", what, abbreviateName(s))
	case len(s) > MaxNameLength:
		return fmt.Errorf("%s %q is %d bytes long, at most %d are allowed", what, abbreviateName(s), len(s), MaxNameLength)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q has a control character (%+q at byte %d)", what, abbreviateName(s), r, i+1)
		}
	}
	return nil
}

// abbreviateName shortens a long name for an error message (%q quotes it).
func abbreviateName(s string) string {
	if len(s) <= 64 {
		return s
	}
	cut := 61
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
