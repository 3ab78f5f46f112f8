//go:build !linux

package sink

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist: the
// keepalives still find an idle connection whose peer vanished.
func setUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
