package chaos

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/history"
)

// The log lines of `tenure worker` the run records (consumer/lane.go,
// consumer/claim.go).
const (
	msgCommitted   = "batch committed"
	msgRejected    = "batch rejected: fenced; dropping this partition's buffered records and checking whether this member still holds it"
	msgClaimFenced = "claim rejected: fenced"
	msgDeadLetter  = "job dead-lettered"
	msgIncarnation = consumer.IncarnationMovedOn
	msgUnknown     = "commit outcome was unknown; resolved from the fencing row"
	msgUnknownLeft = "commit outcome still unknown when the lane stopped; the next claim reads the stored offset"
	msgPanicked    = "handler panicked"
	msgLost        = "partitions lost"
	msgRevokedAll  = "partitions revoked"
	msgClaimed     = "partition claimed"
	msgHolding     = "holding" // --hold-once (cmd/tenure/worker.go holdHooks)
	msgSteppedDown = consumer.MsgSteppedDown
	msgRejoining   = consumer.MsgRejoining
	// A worker noticed an add-partitions: a claim found the topic's
	// partition count changed (consumer's checkLayouts), or its watch read
	// the new count from Kafka.
	msgLayoutChanged = "topic partitions changed: not processing it"
	msgCountChanged  = consumer.MsgPartitionCountChanged
	msgAssigned      = consumer.MsgPartitionsAssigned
)

// Evidence kept for the liveness check's reports: the last lines about
// each partition, and the last lines about the topic as a whole.
const (
	partLinesKept  = 40
	topicLinesKept = 30
)

// assignment is one "claiming partition" line: the coordinator's side of
// the history (history.Assignment), with the process that logged it.
type assignment struct {
	Worker string
	history.Assignment
}

// batchEvent is a commit or a rejection a worker logged (or another line
// of a lane, or of the worker: then only Worker and At may be set).
type batchEvent struct {
	Worker    string
	At        time.Time
	Partition int32
	Token     string
	Member    string
	ClaimID   int64
	From, To  int64
	Outcome   string // a commit of unknown outcome: how it was resolved
}

func (b batchEvent) String() string {
	return fmt.Sprintf("%s: partition %d [%d,%d) token %s member %s at %s", b.Worker, b.Partition, b.From, b.To, b.Token, b.Member, b.At.Format("15:04:05.000"))
}

// logbook collects what every worker logged.
type logbook struct {
	mu           sync.Mutex
	lines        int
	unparsed     int
	commits      []batchEvent
	rejections   []batchEvent
	claimFenced  []batchEvent
	deadLetters  map[string]int // job id -> times logged
	incarnations int            // bumps made (bumped_here)
	incSeen      int            // workers that saw a bump
	unknown      map[string]int // commit outcomes resolved from the fencing row
	panics       int
	lost         int
	claims       int
	assignments  []assignment
	holding      map[string]chan struct{}  // worker -> closed when it logged "holding"
	held         map[string]batchEvent     // worker -> the batch it held at its "holding" line
	byLevel      map[string]map[string]int // level -> msg -> count (warn and error)

	// The database watch (consumer/dbwatch.go) and what a zombie notices.
	stepDowns   []batchEvent          // "stepped_down":true: the worker gives its partitions up
	steppedDown []batchEvent          // consumer.MsgSteppedDown: it has left the group
	rejoins     []batchEvent          // consumer.MsgRejoining
	lostEvents  []batchEvent          // "partitions lost" and "partitions revoked": kgo took partitions from the worker
	unknowns    []batchEvent          // commits of unknown outcome, with how they were resolved
	strict      []history.StrictEvent // strict lanes' offset commits sent and answered, assignments ended

	// For the liveness check and the faults that wait for a line.
	layoutChanged  []batchEvent         // msgLayoutChanged, msgCountChanged: a worker noticed the topic grew
	strictResolved int                  // consumer.MsgStrictResolved: a claim decided an older lane's prepared batch
	partLines      map[int32][]string   // the last lines that name each partition, "worker: line"
	topicLines     []string             // the last info-or-above lines that name the topic but no partition
	waiters        []lineWaiter         // awaitLine
	lastAssigned   map[string]string    // per worker, its last msgAssigned line
	lastLine       map[string]time.Time // per worker, when it last logged anything
}

// lineWaiter is a channel closed when worker ("": any) logs msg.
type lineWaiter struct {
	worker, msg string
	ch          chan struct{}
}

func newLogbook() *logbook {
	return &logbook{deadLetters: map[string]int{}, unknown: map[string]int{}, byLevel: map[string]map[string]int{},
		holding: map[string]chan struct{}{}, held: map[string]batchEvent{}, partLines: map[int32][]string{}, lastLine: map[string]time.Time{},
		lastAssigned: map[string]string{}}
}

func (lb *logbook) record(worker, line string) {
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		lb.mu.Lock()
		lb.lines++
		lb.unparsed++
		lb.mu.Unlock()
		return
	}
	msg, _ := m["msg"].(string)
	level, _ := m["level"].(string)
	if sev, ok := history.ParseStrictEvent(groupName, m); ok {
		lb.mu.Lock()
		lb.strict = append(lb.strict, sev)
		lb.mu.Unlock()
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.lines++
	lb.lastLine[worker] = time.Now()
	lb.keepEvidence(worker, line, level, m)
	lb.wakeWaiters(worker, msg)
	if level == "warn" || level == "error" {
		if lb.byLevel[level] == nil {
			lb.byLevel[level] = map[string]int{}
		}
		lb.byLevel[level][msg]++
	}
	if sd, _ := m["stepped_down"].(bool); sd {
		lb.stepDowns = append(lb.stepDowns, eventOf(worker, m))
	}
	if a, ok := history.ParseAssignment(groupName, m); ok {
		lb.assignments = append(lb.assignments, assignment{Worker: worker, Assignment: a})
	}
	lb.recordMsg(worker, line, msg, m)
}

// eventOf is the batch event a worker's line m describes.
func eventOf(worker string, m map[string]any) batchEvent {
	e := batchEvent{Worker: worker, At: time.Now()}
	if ts, ok := m["ts"].(string); ok {
		if t, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts); err == nil {
			e.At = t
		}
	}
	if p, ok := m["partition"].(float64); ok {
		e.Partition = int32(p)
	}
	e.Token, _ = m["token"].(string)
	e.Member, _ = m["member"].(string)
	if f, ok := m["from"].(float64); ok {
		e.From = int64(f)
	}
	if t, ok := m["to"].(float64); ok {
		e.To = int64(t)
	}
	if c, ok := m["claim_id"].(float64); ok {
		e.ClaimID = int64(c)
	}
	return e
}

// keepEvidence keeps the line among the last about its partition, or
// about the topic (info or above). lb.mu is held.
func (lb *logbook) keepEvidence(worker, line, level string, m map[string]any) {
	if p, ok := m["partition"].(float64); ok {
		ring := append(lb.partLines[int32(p)], worker+": "+line)
		lb.partLines[int32(p)] = ring[max(0, len(ring)-partLinesKept):]
	} else if _, ok := m["topic"]; ok && level != "debug" {
		lb.topicLines = append(lb.topicLines, worker+": "+line)
		lb.topicLines = lb.topicLines[max(0, len(lb.topicLines)-topicLinesKept):]
	}
}

// wakeWaiters closes the awaitLine channels that wait for this line.
// lb.mu is held.
func (lb *logbook) wakeWaiters(worker, msg string) {
	if len(lb.waiters) > 0 {
		lb.waiters = slices.DeleteFunc(lb.waiters, func(lw lineWaiter) bool {
			if lw.msg == msg && (lw.worker == "" || lw.worker == worker) {
				close(lw.ch)
				return true
			}
			return false
		})
	}
}

// recordMsg records what the line's msg says. lb.mu is held.
func (lb *logbook) recordMsg(worker, line, msg string, m map[string]any) {
	ev := func() batchEvent { return eventOf(worker, m) }
	switch msg {
	case msgHolding:
		if ch := lb.holding[worker]; ch != nil {
			lb.held[worker] = ev()
			close(ch)
			delete(lb.holding, worker)
		}
	case msgCommitted:
		lb.commits = append(lb.commits, ev())
	case msgRejected:
		if f, _ := m["fenced"].(bool); f {
			lb.rejections = append(lb.rejections, ev())
		}
	case msgClaimFenced:
		lb.claimFenced = append(lb.claimFenced, ev())
	case msgDeadLetter:
		job, _ := m["job"].(string)
		lb.deadLetters[job]++
	case msgIncarnation:
		lb.incSeen++
		if b, _ := m["bumped_here"].(bool); b {
			lb.incarnations++
		}
	case msgUnknown:
		out, _ := m["outcome"].(string)
		lb.unknown[out]++
		e := ev()
		e.Outcome = out
		lb.unknowns = append(lb.unknowns, e)
	case msgUnknownLeft:
		e := ev()
		e.Outcome = "unresolved when the lane stopped"
		lb.unknowns = append(lb.unknowns, e)
	case msgPanicked:
		lb.panics++
	case msgLost:
		lb.lost++
		lb.lostEvents = append(lb.lostEvents, ev())
	case msgRevokedAll:
		lb.lostEvents = append(lb.lostEvents, ev())
	case msgSteppedDown:
		lb.steppedDown = append(lb.steppedDown, ev())
	case msgRejoining:
		lb.rejoins = append(lb.rejoins, ev())
	case msgClaimed:
		lb.claims++
	case msgLayoutChanged, msgCountChanged:
		lb.layoutChanged = append(lb.layoutChanged, ev())
	case msgAssigned:
		lb.lastAssigned[worker] = worker + ": " + line
	case consumer.MsgStrictResolved:
		lb.strictResolved++
	}
}

// awaitLine returns a channel closed once worker ("": any worker) logs a
// line whose msg is msg; call it before the line can come.
func (lb *logbook) awaitLine(worker, msg string) <-chan struct{} {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	ch := make(chan struct{})
	lb.waiters = append(lb.waiters, lineWaiter{worker: worker, msg: msg, ch: ch})
	return ch
}

// linesAbout are the last n lines that name partition p, those of worker
// only unless it is "" (or logged none).
func (lb *logbook) linesAbout(p int32, worker string, n int) []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var out []string
	for _, l := range lb.partLines[p] {
		if worker == "" || strings.HasPrefix(l, worker+": ") {
			out = append(out, l)
		}
	}
	if len(out) == 0 && worker != "" {
		out = lb.partLines[p]
	}
	return compactLines(out[max(0, len(out)-n):])
}

// assignedLines are the workers' last "partitions assigned" lines: what
// each believes it holds.
func (lb *logbook) assignedLines(workers []string) []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var out []string
	for _, w := range workers {
		if l, ok := lb.lastAssigned[w]; ok {
			out = append(out, l)
		}
	}
	return compactLines(out)
}

// topicLinesTail are the last n lines about the topic as a whole.
func (lb *logbook) topicLinesTail(n int) []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return compactLines(lb.topicLines[max(0, len(lb.topicLines)-n):])
}

// compactLines shortens "worker: {json}" lines for a report: the worker,
// the time of day, the level, the message and the fields but those every
// line of the run carries.
func compactLines(ls []string) []string {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		worker, raw, _ := strings.Cut(l, ": ")
		var m map[string]any
		if json.Unmarshal([]byte(raw), &m) != nil {
			out = append(out, l)
			continue
		}
		ts, _ := m["ts"].(string)
		if t, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts); err == nil {
			ts = t.Local().Format("15:04:05.000") // as the harness's own times are shown
		}
		b := fmt.Sprintf("%s %s %v: %v", worker, ts, m["level"], m["msg"])
		keys := slices.Sorted(maps.Keys(m))
		for _, k := range keys {
			switch k {
			case "ts", "level", "msg", "worker", "group", "topic", "member", "gid", "caller":
				continue
			}
			v := fmt.Sprint(m[k])
			if f, ok := m[k].(float64); ok && f == float64(int64(f)) {
				v = strconv.FormatInt(int64(f), 10)
			}
			b += " " + k + "=" + v
		}
		out = append(out, b)
	}
	return out
}

// outOfGroup returns, per worker, the step-down (the "stepped_down" line)
// not followed by a rejoin line of that worker: a worker still out of the
// group.
func (lb *logbook) outOfGroup() map[string]batchEvent {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := map[string]batchEvent{}
	for _, sd := range lb.stepDowns {
		out[sd.Worker] = sd
	}
	for _, rj := range lb.rejoins {
		if sd, ok := out[rj.Worker]; ok && !rj.At.Before(sd.At) {
			delete(out, rj.Worker)
		}
	}
	return out
}

// awaitHolding returns a channel closed once worker logs "holding" (its
// --hold-once point); call it before the worker starts.
func (lb *logbook) awaitHolding(worker string) <-chan struct{} {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	ch := make(chan struct{})
	lb.holding[worker] = ch
	return ch
}

// heldBatch is the batch worker held at its --hold-once point, if it did.
func (lb *logbook) heldBatch(worker string) (batchEvent, bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	e, ok := lb.held[worker]
	return e, ok
}

// claimants maps each claim id to the worker process whose lane claimed with
// it, and returns the assignments for history.CheckOwnership.
func (lb *logbook) claimants() (map[int64]string, []history.Assignment) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	byClaim := map[int64]string{}
	var out []history.Assignment
	for _, a := range lb.assignments {
		byClaim[a.ClaimID] = a.Worker
		out = append(out, a.Assignment)
	}
	return byClaim, out
}

// strictEvents are the strict lanes' lines, for history.CheckStrict.
func (lb *logbook) strictEvents() []history.StrictEvent {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return append([]history.StrictEvent(nil), lb.strict...)
}

// workerOf returns the worker process that last logged being assigned p
// as member ("claiming partition"), or "".
func (lb *logbook) workerOf(member string, p int32) string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for i := len(lb.assignments) - 1; i >= 0; i-- {
		if a := lb.assignments[i]; a.Member == member && a.Partition.Partition == p {
			return a.Worker
		}
	}
	return ""
}

// topMessages lists the most frequent warn and error messages.
func (lb *logbook) topMessages(n int) []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for level, msgs := range lb.byLevel {
		for msg, c := range msgs {
			if len(msg) > 90 {
				msg = msg[:90] + "…"
			}
			all = append(all, kv{level + ": " + msg, c})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].v != all[j].v {
			return all[i].v > all[j].v
		}
		return all[i].k < all[j].k
	})
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, fmt.Sprintf("%6d  %s", all[i].v, strings.TrimSpace(all[i].k)))
	}
	return out
}

// Only a broker SIGKILL that came back before the hold, and not long
// before it, explains an ahead-of-log hold.
func TestBrokerKillBefore(t *testing.T) {
	at := time.Date(2026, 12, 3, 13, 39, 41, 500e6, time.UTC)
	kill := &fault{Kind: kindBrokerRst, Mode: "kill", Injected: at.Add(-1500 * time.Millisecond), Ended: at.Add(-300 * time.Millisecond)}
	term := &fault{Kind: kindBrokerRst, Mode: "term", Injected: at.Add(-time.Second), Ended: at.Add(-500 * time.Millisecond)}
	late := &fault{Kind: kindBrokerRst, Mode: "kill", Injected: at.Add(-time.Second), Ended: at.Add(time.Second)}
	old := &fault{Kind: kindBrokerRst, Mode: "kill", Injected: at.Add(-2 * time.Minute), Ended: at.Add(-119 * time.Second)}
	pause := &fault{Kind: kindPause, Injected: at.Add(-time.Second), Ended: at.Add(-100 * time.Millisecond)}
	for _, c := range []struct {
		faults []*fault
		want   *fault
	}{
		{[]*fault{kill}, kill},
		{[]*fault{term}, nil},
		{[]*fault{late}, nil},
		{[]*fault{old}, nil},
		{[]*fault{pause}, nil},
		{[]*fault{old, kill, term}, kill},
	} {
		if got := brokerKillBefore(c.faults, at, time.Minute); got != c.want {
			t.Errorf("%v: got %v, want %v", c.faults, got, c.want)
		}
	}
}

// A report's lines keep what tells one line from another.
func TestCompactLines(t *testing.T) {
	got := compactLines([]string{
		`w2.0: {"level":"debug","ts":"2026-12-06T12:11:12.983Z","msg":"batch committed","worker":"w2.0","group":"chaos-workers","topic":"chaos-jobs","partition":1,"member":"m-1","claim_id":2236399470413555,"token":"0.1","from":5,"to":6,"records":1}`,
		"w1.0: not json",
	})
	at := time.Date(2026, 12, 6, 12, 11, 12, 983e6, time.UTC).Local().Format("15:04:05.000")
	want := []string{"w2.0 " + at + " debug: batch committed claim_id=2236399470413555 from=5 partition=1 records=1 to=6 token=0.1", "w1.0: not json"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
