package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// notA is what a flag's own Value says of a value it cannot take: what
// such a value is ("a size: a whole number of bytes, ..."). badValue puts
// it after the flag and the value: `--max-bytes "4MB" is not a size: ...`.
type notA struct{ what string }

func (e notA) Error() string { return "not " + e.what }

// badValue is the one sentence for a value a flag, or the variable it
// reads, cannot take. given is how the value was given, `--partition
// "abc"` or `TENURE_PARTITION="abc"`; typ is the flag's type (pflag's
// Value.Type) and cause what parsing it said. pflag's own sentences
// (`strconv.ParseInt: parsing "abc": invalid syntax`) name Go functions,
// not what the flag takes; these name the flag, the value and what it
// takes.
func badValue(given, value, typ string, cause error) string {
	var na notA
	switch {
	case errors.As(cause, &na):
		return given + " is " + na.Error()
	case typ == "int" && errors.Is(cause, strconv.ErrRange):
		if strings.HasPrefix(strings.TrimSpace(value), "-") {
			return given + " is too small a number"
		}
		return given + " is too large a number"
	case typ == "int":
		return given + " is not a whole number"
	case typ == "duration":
		return given + " is not a duration: a number with a unit, such as 500ms, 30s, 2m or 1h30m"
	case typ == "bool":
		return given + " is not true or false"
	}
	return fmt.Sprintf("%s: %v", given, cause)
}

// badFlagValue is badValue for a value given on the command line.
func badFlagValue(name, value, typ string, cause error) string {
	return badValue(fmt.Sprintf("--%s %q", name, value), value, typ, cause)
}

// badEnvValue is badValue for a value a flag read from its variable.
func badEnvValue(variable, value, typ string, cause error) string {
	return badValue(fmt.Sprintf("%s=%q", variable, value), value, typ, cause)
}
