package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

var probeSpec = spec{name: "probe", args: "URL", maxArgs: 1,
	short: "GET a worker's /healthz, /readyz or /metrics (for container health checks)",
	long:  "Prints the body of URL and exits 0 when the answer is 2xx, 1 otherwise (e.g. http://127.0.0.1:8080/readyz)."}

// probeCmd is a health check for images without curl (the distroless
// image): `tenure probe http://127.0.0.1:8080/readyz` prints the body and
// exits 0 on a 2xx answer, 1 otherwise.
type probeCmd struct {
	base
	timeout time.Duration
	url     *url.URL
}

func (c *probeCmd) define(f *flagSet) {
	f.Duration(&c.timeout, "timeout", 5*time.Second, "bound on the request")
}

func (c *probeCmd) check(args []string) error {
	if len(args) != 1 {
		return usagef("a URL is required, e.g. http://127.0.0.1:8080/readyz")
	}
	u, err := url.Parse(args[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("%q is not an http:// or https:// URL", args[0])
	}
	if c.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	c.url = u
	return nil
}

func (c *probeCmd) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url.String(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no answer from %s: %v", c.url.Redacted(), err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(c.stdout, io.LimitReader(resp.Body, 16<<20)); err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", c.url.Redacted(), resp.Status)
	}
	return nil
}
