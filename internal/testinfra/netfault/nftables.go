package netfault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// nftPath finds nft: on PATH, or in /usr/sbin, where Debian puts it and
// which a non-login PATH may lack.
func nftPath() (string, error) {
	if p, err := exec.LookPath("nft"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/nft"
	if fi, err := os.Stat(debian); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return debian, nil
	}
	return "", errors.New("nftables' nft not found (apt-get install nftables, or call netfault.EnsureNftables)")
}

var ensureMu sync.Mutex

// installTimeout bounds EnsureNftables' apt-get runs, each.
const installTimeout = 5 * time.Minute

// EnsureNftables installs Debian's nftables package with apt-get when nft
// is missing and the process is root; otherwise it returns a clear error.
// apt-get waits (bounded) for a dpkg lock held by another installer, so
// test binaries calling this at once do not fail on each other.
func EnsureNftables(ctx context.Context) error {
	ensureMu.Lock()
	defer ensureMu.Unlock()
	if _, err := nftPath(); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: nft is missing and installing it needs root: apt-get install nftables", ErrUnsupported)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: nft is missing and there is no apt-get to install it", ErrUnsupported)
	}
	apt := func(args ...string) error {
		ctx, cancel := context.WithTimeout(ctx, installTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "apt-get", append([]string{"-o", "DPkg::Lock::Timeout=120"}, args...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: apt-get %v: %v: %s", ErrUnsupported, args, err, tail(out, 2000))
		}
		return nil
	}
	// Install from the lists already there first: update only if that
	// fails (a fresh machine has none), so a machine that has them does
	// not hit the network for nothing.
	if err := apt("install", "-y", "-qq", "--no-install-recommends", "nftables"); err != nil {
		if err := apt("update", "-qq"); err != nil {
			return err
		}
		if err := apt("install", "-y", "-qq", "--no-install-recommends", "nftables"); err != nil {
			return err
		}
	}
	if _, err := nftPath(); err != nil {
		return fmt.Errorf("%w: nftables installed but %v", ErrUnsupported, err)
	}
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
