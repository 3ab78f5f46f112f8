package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// stuckSession is the workers' session timeout in TestAlertPartitionStuckAfterSIGKILL:
// long enough that the coordinator still lists the killed worker when
// TenurePartitionStuck fires (30s over the threshold for 30s).
const stuckSession = 120 * time.Second

// A worker is killed (SIGKILL) with jobs waiting on its partitions. Within
// the real 30 s bound, with the shipped timings, while the coordinator
// still lists it as the partitions' member: `tenure admin assignments`
// (JSON and table) and the ownership page (`tenure admin serve`) show
// them owner-silent, with the reason and how long, and the surviving
// worker exports tenure_partition_stuck_seconds for them. A real
// Prometheus scraping only the survivor, with the shipped rules, fires
// TenurePartitionStuck. Without /usr/bin/prometheus the test fails.
func TestAlertPartitionStuckAfterSIGKILL(t *testing.T) {
	t.Parallel()
	promBin := prometheusBin(t)
	e := newEnv(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	session := []string{"--session-timeout", stuckSession.String()}
	a := e.startWorker("A", session...)
	b := e.startWorker("B", append(session, "--http-addr", "127.0.0.1:0")...)
	waitForMembers(t, e, 2)
	for p := int32(0); p < 4; p++ {
		e.produceTo(p, jobsFor(keys, 0, 10)...)
	}
	owners := map[int32]string{}
	waitFor(t, 60*time.Second, "every partition done, each worker owning some", func() bool {
		byWorker := map[string]bool{}
		for p := int32(0); p < 4; p++ {
			f := fenceRow(t, e, p)
			if f.next < 10 || len(f.owner) < len("tenure-A") {
				return false
			}
			owners[p] = f.owner
			byWorker[f.owner[:len("tenure-A")]] = true
		}
		return len(byWorker) == 2
	})
	var aMember string
	var aParts []int32
	for p, o := range owners {
		if strings.HasPrefix(o, "tenure-A") {
			aMember = o
			aParts = append(aParts, p)
		}
	}
	target := b.httpAddr()
	prom := startPrometheus(t, promBin, target)
	page := startPageServer(t, e, ctx)

	// Both have written their heartbeat rows (within a moment of joining).
	waitFor(t, 10*time.Second, "both workers' heartbeat rows", func() bool {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".workers WHERE consumer_group = $1`, e.group).Scan(&n)
		return err == nil && n == 2
	})
	a.kill()
	killed := time.Now()
	for p := int32(0); p < 4; p++ {
		e.produceTo(p, jobsFor(keys, 10, 10)...)
	}
	t.Logf("killed A (%s, partitions %v)", aMember, aParts)

	// admin assignments: owner-silent, the coordinator's member still A.
	t.Run("AdminAssignments", func(t *testing.T) { checkOwnerSilentRows(t, e, owners, aMember, aParts, killed) })
	// The ownership page says the same.
	t.Run("OwnershipPage", func(t *testing.T) { checkOwnerSilentPage(t, page, aMember, aParts, killed) })

	// The survivor's group watch reports A's partitions.
	waitFor(t, 30*time.Second, "B's metrics to report A's partitions stuck", func() bool {
		_, m := b.get("/metrics")
		for _, p := range aParts {
			if !strings.Contains(m, fmt.Sprintf(`tenure_partition_stuck_seconds{consumer_group=%q,partition="%d",state="owner-silent",topic=%q}`, e.group, p, e.topic)) {
				return false
			}
		}
		return true
	})
	t.Logf("B's metrics: owner-silent %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	if d := time.Since(killed); d > 30*time.Second {
		t.Errorf("B's metric showed it %s after the kill, past 30s", d.Round(100*time.Millisecond))
	}

	// Prometheus, scraping B alone, fires the shipped alert.
	var firing *promAlert
	waitFor(t, stuckSession-time.Since(killed)-5*time.Second, "TenurePartitionStuck to fire in Prometheus", func() bool {
		for _, al := range prom.alerts("TenurePartitionStuck") {
			if al.State == "firing" && al.Labels["state"] == "owner-silent" && al.Labels["partition"] == fmt.Sprint(aParts[0]) {
				firing = &al
				return true
			}
		}
		return false
	})
	t.Logf("TenurePartitionStuck firing %s after the kill: %v\n  %s", time.Since(killed).Round(time.Second), firing.Labels, firing.Annotations["description"])
	if firing.Labels["consumer_group"] != e.group || firing.Labels["severity"] != "critical" || firing.Labels["instance"] != "" ||
		!strings.Contains(firing.Annotations["description"], "`tenure admin assignments --group "+e.group+"`") {
		t.Errorf("alert %+v", firing)
	}
	if rows := rowsByPartition(assignmentsJSON(t, e)); rows[int(aParts[0])]["member_id"] != aMember {
		t.Errorf("the coordinator no longer lists A: the alert fired after the partition moved: %v", rows[int(aParts[0])])
	}
	b.stop(30 * time.Second)
}

// checkOwnerSilentRows: admin assignments shows the killed member's
// partitions (aParts) owner-silent, with the coordinator still listing it,
// and the others ok; owners holds each partition's owner before the kill.
func checkOwnerSilentRows(t *testing.T, e *env, owners map[int32]string, aMember string, aParts []int32, killed time.Time) {
	t.Helper()
	var rows map[int]map[string]any
	waitFor(t, 30*time.Second, "admin assignments to show A's partitions owner-silent", func() bool {
		rows = rowsByPartition(assignmentsJSON(t, e))
		for _, p := range aParts {
			if rows[int(p)]["state"] != "owner-silent" {
				return false
			}
		}
		return true
	})
	t.Logf("admin assignments: owner-silent %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	for _, p := range aParts {
		r := rows[int(p)]
		reason := fmt.Sprint(r["reason"])
		if r["member_id"] != aMember || r["fence_owner"] != aMember {
			t.Errorf("partition %d: the coordinator should still list A: %v", p, r)
		}
		for _, want := range []string{"owner " + aMember + " silent for ", "(no heartbeat for ", "client tenure-A on host ",
			" jobs waiting; the coordinator moves the partition when the member's session times out"} {
			if !strings.Contains(reason, want) {
				t.Errorf("partition %d: reason %q lacks %q", p, reason, want)
			}
		}
		if s, ok := r["for_seconds"].(float64); !ok || s < 10 || r["since"] == nil {
			t.Errorf("partition %d: since %v, for %v s", p, r["since"], r["for_seconds"])
		}
	}
	for p, r := range rows {
		if !strings.HasPrefix(owners[int32(p)], "tenure-A") && r["state"] != "ok" {
			t.Errorf("B's partition %d: %v", p, r)
		}
	}
	tab := runCLI(t, 60*time.Second, "", "admin", "assignments", "--brokers", strings.Join(e.brokers, ","),
		"--group", e.group, "--database-url", e.dbURL, "--schema", e.schema)
	if tab.code != 0 || !regexp.MustCompile(`owner-silent\s+\d+s\n`).MatchString(tab.stdout) ||
		!strings.Contains(tab.stdout, " owner-silent: owner "+aMember+" silent for ") {
		t.Errorf("admin assignments (table) should show owner-silent, how long, and the reason:\n%s", tab)
	}

}

// checkOwnerSilentPage: the ownership page shows the same, within 30s of
// the kill.
func checkOwnerSilentPage(t *testing.T, page *pageServer, aMember string, aParts []int32, killed time.Time) {
	t.Helper()
	waitFor(t, 30*time.Second, "the ownership page to show A's partitions owner-silent", func() bool {
		var snap struct {
			Groups []struct {
				Summary struct {
					Stuck int `json:"stuck"`
				} `json:"summary"`
				Partitions []struct {
					Partition int    `json:"partition"`
					State     string `json:"state"`
					Reason    string `json:"reason"`
					For       *int64 `json:"for_seconds"`
					Stuck     bool   `json:"stuck"`
				} `json:"partitions"`
			} `json:"groups"`
		}
		if err := json.Unmarshal([]byte(httpGet(t, page.url+"api/ownership")), &snap); err != nil || len(snap.Groups) != 1 {
			return false
		}
		silent := 0
		for _, p := range snap.Groups[0].Partitions {
			if p.State == "owner-silent" && p.Stuck && p.For != nil && strings.Contains(p.Reason, aMember+" silent for") {
				silent++
			}
		}
		return silent == len(aParts) && snap.Groups[0].Summary.Stuck == len(aParts)
	})
	if html := httpGet(t, page.url); !strings.Contains(html, "owner-silent") || !strings.Contains(html, "with jobs waiting not progressing") {
		t.Errorf("the page should show the state and count it")
	}
	if d := time.Since(killed); d > 30*time.Second {
		t.Errorf("admin assignments and the page showed it %s after the kill, past 30s", d.Round(100*time.Millisecond))
	}
}

// alerts returns the named alerts, pending or firing, of every instance.
func (p *promServer) alerts(name string) []promAlert {
	p.t.Helper()
	code, body, err := p.get("/api/v1/alerts")
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET /api/v1/alerts: %d %v %s\nprometheus log:\n%s", code, err, body, p.output())
	}
	var resp struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		p.t.Fatalf("/api/v1/alerts: %v %s", err, body)
	}
	var out []promAlert
	for _, a := range resp.Data.Alerts {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out
}

// httpGet returns the body of url ("" when it does not answer 200).
func httpGet(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}
