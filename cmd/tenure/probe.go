package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

func init() {
	register(command{name: "probe", summary: "GET a worker's /healthz, /readyz or /metrics (for container health checks)", run: runProbe})
}

// runProbe is a health check for images without curl (the distroless
// image): `tenure probe http://127.0.0.1:8080/readyz` prints the body and
// exits 0 on a 2xx answer, 1 otherwise.
func runProbe(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "probe", "URL [--timeout D]\n\n"+
		"prints the body of URL and exits 0 when the answer is 2xx, 1 otherwise (e.g. http://127.0.0.1:8080/readyz)")
	timeout := f.Duration("timeout", 5*time.Second, "bound on the request")
	if err := f.parse(args, 1); err != nil {
		return err
	}
	if len(f.positional) != 1 {
		return usagef("a URL is required, e.g. http://127.0.0.1:8080/readyz")
	}
	u, err := url.Parse(f.positional[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("%q is not an http:// or https:// URL", f.positional[0])
	}
	if *timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no answer from %s: %v", u.Redacted(), err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(e.stdout, io.LimitReader(resp.Body, 16<<20)); err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", u.Redacted(), resp.Status)
	}
	return nil
}
