package partition

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxCount is the largest partition count tenure asks a broker for, or
// accepts as a topic's count: 10000 partitions in one topic.
//
// Kafka's wire format allows 2^31-1, but no broker serves that: every
// partition costs the broker memory, files and a leader, and a cluster is
// sized for some thousands of partitions per broker in all. tenure's
// development broker refuses larger requests (it used to grow until the
// machine ran out of memory), and the tenure command refuses them before
// sending anything. A worker's parallelism is bounded by the partition
// count, so 10000 is far beyond what one consumer group uses.
const MaxCount = 10000

// CheckCount returns an error unless n is a partition count between 1 and
// MaxCount.
func CheckCount(n int64) error {
	if n < 1 || n > MaxCount {
		return fmt.Errorf("partition count %d is out of range: it must be between 1 and %d", n, MaxCount)
	}
	return nil
}

// ParseCount parses a decimal partition count, between 1 and MaxCount. It
// parses the full width of the text: "4294967297" is out of range, not 1.
func ParseCount(s string) (int32, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return 0, fmt.Errorf("partition count %q is out of range: it must be between 1 and %d", s, MaxCount)
		}
		return 0, fmt.Errorf("partition count %q is not a whole number", s)
	}
	if err := CheckCount(n); err != nil {
		return 0, err
	}
	return int32(n), nil
}
