package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tenure-dev/tenure/internal/childproc"
)

// signalError is the cause of the context a signal cancelled.
type signalError struct{ sig os.Signal }

func (s signalError) Error() string { return "received " + childproc.SignalName(s.sig) }

// stopSignal returns the name of the signal that cancelled ctx, or "".
func stopSignal(ctx context.Context) string {
	var se signalError
	if errors.As(context.Cause(ctx), &se) {
		return childproc.SignalName(se.sig)
	}
	return ""
}

// signalContext is cancelled by the first SIGINT/SIGTERM (graceful stop; the
// cause is a signalError); a second one exits at once with status 130,
// saying so on stderr.
func signalContext(stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-ch
		cancel(signalError{s})
		s = <-ch
		fmt.Fprintf(stderr, "tenure: second signal (%s): exiting at once with status 130\n", childproc.SignalName(s))
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(ch); cancel(nil) }
}
