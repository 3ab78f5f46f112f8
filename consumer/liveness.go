package consumer

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/sink"
)

// The liveness rules of Describe (Assignment.State): a partition with jobs
// waiting that makes no progress is shown as such, with how long, however
// the coordinator and the fencing row agree. Variables, so that tests can
// shorten them.
var (
	// silentAfter: a member whose heartbeat row (fence.Store.Heartbeat,
	// every heartbeatEvery) is older than this, five missed beats, is
	// silent.
	silentAfter = 10 * time.Second
	// stuckAfter: an owned partition whose fencing row shows no commit or
	// claim for this long, while its oldest waiting job is older than this
	// too, is not progressing.
	stuckAfter = 20 * time.Second
)

// facts are what the liveness rules read besides the rows. Times are on
// the database's clock, except the jobs' timestamps (the log's).
type facts struct {
	now  time.Time
	view groupView
	// workers are the group's heartbeat rows, by member id.
	workers map[string]sink.Worker
	// activity is each fencing row's last claim or commit.
	activity map[tp]time.Time
	// waiting is what the log says about each suspect partition's oldest
	// waiting job, where it could be read (oldestWaiting).
	waiting map[tp]waitingJob
}

// waitingJob is what the log says about the oldest job a partition has
// waiting (the first record the workers can read at or after its next
// offset).
type waitingJob struct {
	at time.Time // the record's timestamp; zero when unknown
	// none: the log holds no job there that the workers can read yet: what
	// the lag counts is transaction markers, aborted records, or a
	// producer's transaction not committed yet (the workers read committed
	// records only). A transactional producer leaves a lag of at least 1
	// (its last commit marker) on a partition whose jobs are all done.
	none bool
}

func newFacts(now time.Time, view groupView, workers []sink.Worker, fences []sink.Fence) facts {
	f := facts{now: now, view: view, workers: map[string]sink.Worker{}, activity: map[tp]time.Time{}, waiting: map[tp]waitingJob{}}
	for _, w := range workers {
		f.workers[w.MemberID] = w
	}
	for _, fe := range fences {
		at := fe.ClaimedAt
		if fe.CommittedAt != nil && fe.CommittedAt.After(at) {
			at = *fe.CommittedAt
		}
		f.activity[tp{fe.Topic, fe.Partition.Partition}] = at
	}
	return f
}

func waiting(a *Assignment) bool { return a.Lag != nil && *a.Lag > 0 }

// suspects are the partitions whose oldest waiting job the rules need to
// know, with their next offsets: jobs waiting, and either not ok, or ok
// with a fencing row that has not moved for stuckAfter. The first are
// read so that their state can say since when it holds; the second to
// tell a partition that does not progress from one whose owner was idle
// and has just been given a job.
func (f facts) suspects(rows []Assignment) map[tp]int64 {
	out := map[tp]int64{}
	for i := range rows {
		a := &rows[i]
		if !waiting(a) || a.State == StateRebalancing {
			continue
		}
		k := tp{a.Topic, a.Partition}
		next := *a.HighWatermark - *a.Lag // the next offset, or where a first claim would start
		act, ok := f.activity[k]
		if a.State != StateOK || (ok && f.now.Sub(act) >= stuckAfter) {
			out[k] = next
		}
	}
	return out
}

// judge applies the liveness rules to rows (see Assignment.State) and sets
// each row's Since and ForSeconds where the state's start can be known.
// Holds are applied after it (applyHolds).
func (f facts) judge(rows []Assignment) {
	for i := range rows {
		a := &rows[i]
		k := tp{a.Topic, a.Partition}
		act, hasAct := f.activity[k]
		w := f.waiting[k]
		switch a.State {
		case StateOK, StateClaimPending, StateStaleOwner:
			if since, ok := f.silent(a, act, hasAct); ok {
				a.State, a.Reason = StateOwnerSilent, f.silentReason(a, since, act, hasAct)
				a.setSince(since, f.now)
				continue
			}
			if a.State == StateOK && waiting(a) && hasAct && f.now.Sub(act) >= stuckAfter && !w.none &&
				(w.at.IsZero() || f.now.Sub(w.at) >= stuckAfter) {
				a.State, a.Reason = StateNotProgressing, f.stuckReason(a, act, w)
				a.setSince(later(act, w.at), f.now)
				continue
			}
		case StateUnowned:
			if waiting(a) && !w.none {
				a.Reason = f.unownedReason(a, w)
			}
		}
		// A rebalance's start is not the partition's last commit: unknown.
		if a.State != StateOK && a.State != StateRebalancing && waiting(a) && !w.none {
			if since := later(act, w.at); !since.IsZero() {
				a.setSince(since, f.now)
			}
		}
	}
}

// silent reports whether the member assigned a's partition is silent, and
// since when: its heartbeat row is older than silentAfter, or it has none
// while it holds the fencing row, jobs wait, and the row has not moved for
// silentAfter (a worker of a version without heartbeats). A member whose
// own fencing row moved within silentAfter is not silent, whatever its
// heartbeat says.
func (f facts) silent(a *Assignment, act time.Time, hasAct bool) (since time.Time, ok bool) {
	m := a.MemberID
	if m == "" {
		return time.Time{}, false
	}
	owns := a.FenceOwner == m && hasAct
	if owns && f.now.Sub(act) < silentAfter {
		return time.Time{}, false
	}
	if w, ok := f.workers[m]; ok {
		if f.now.Sub(w.SeenAt) < silentAfter {
			return time.Time{}, false
		}
		if owns {
			return later(w.SeenAt, act), true
		}
		return w.SeenAt, true
	}
	if owns && waiting(a) {
		return act, true
	}
	return time.Time{}, false
}

func (f facts) silentReason(a *Assignment, since, act time.Time, hasAct bool) string {
	var b strings.Builder
	if a.FenceOwner == a.MemberID {
		fmt.Fprintf(&b, "owner %s", a.MemberID)
	} else {
		fmt.Fprintf(&b, "member %s, assigned the partition and yet to claim it,", a.MemberID)
	}
	fmt.Fprintf(&b, " silent for %s", seconds(f.now.Sub(since)))
	if w, ok := f.workers[a.MemberID]; ok {
		fmt.Fprintf(&b, " (no heartbeat for %s", seconds(f.now.Sub(w.SeenAt)))
		if a.FenceOwner == a.MemberID && hasAct {
			fmt.Fprintf(&b, ", no commit for %s", seconds(f.now.Sub(act)))
		}
		fmt.Fprintf(&b, "; it was client %s on host %s, pid %d)", w.ClientID, w.Host, w.PID)
	} else {
		fmt.Fprintf(&b, " (no heartbeat recorded, no commit or claim)")
	}
	fmt.Fprintf(&b, "; %s; the coordinator moves the partition when the member's session times out", jobsWaiting(a))
	return b.String()
}

func (f facts) stuckReason(a *Assignment, act time.Time, w waitingJob) string {
	var b strings.Builder
	fmt.Fprintf(&b, "no commit for %s with %s, ", seconds(f.now.Sub(act)), jobsWaiting(a))
	if w.at.IsZero() {
		b.WriteString("the oldest's age unknown (its record could not be read)")
	} else {
		fmt.Fprintf(&b, "the oldest for %s", seconds(f.now.Sub(w.at)))
	}
	fmt.Fprintf(&b, "; owner %s is alive", a.MemberID)
	if hb, ok := f.workers[a.MemberID]; ok {
		fmt.Fprintf(&b, " (heartbeat %s ago, client %s on host %s, pid %d)", seconds(f.now.Sub(hb.SeenAt)), hb.ClientID, hb.Host, hb.PID)
	}
	b.WriteString(": a batch running long, a batch failing and being retried, or the lane is stuck; the worker's log for the partition says which")
	return b.String()
}

func (f facts) unownedReason(a *Assignment, w waitingJob) string {
	var b strings.Builder
	fmt.Fprintf(&b, "no member of the group is assigned the partition; %s", jobsWaiting(a))
	if !w.at.IsZero() {
		fmt.Fprintf(&b, ", the oldest for %s", seconds(f.now.Sub(w.at)))
	}
	consumes := false
	for _, m := range f.view.members {
		consumes = consumes || slices.Contains(m.subscribed, a.Topic) || len(m.assigned[a.Topic]) > 0
	}
	switch {
	case len(f.view.members) == 0:
		b.WriteString(": the group has no members (no worker runs, or none has joined)")
	case !consumes:
		fmt.Fprintf(&b, ": no member of the group consumes topic %s (their --topic)", a.Topic)
	default:
		b.WriteString(": the members consume the topic, but the coordinator has not assigned this partition " +
			"(a partition added to the topic is assigned once the members' metadata shows it)")
	}
	return b.String()
}

func jobsWaiting(a *Assignment) string {
	if !waiting(a) {
		return "no jobs waiting"
	}
	if *a.Lag == 1 {
		return "1 job waiting"
	}
	return fmt.Sprintf("%d jobs waiting", *a.Lag)
}

// setSince records when a's state began, and how long ago that is.
func (a *Assignment) setSince(since, now time.Time) {
	if since.IsZero() {
		return
	}
	since = since.UTC()
	a.Since = &since
	a.ForSeconds = ptr(int64(max(now.Sub(since), 0) / time.Second))
}

// later is the later of two times; a zero time is unknown.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// seconds says a duration the way reasons do: "14 s", "5 min", "3 h",
// "2 days".
func seconds(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("%d s", d/time.Second)
	case d < 2*time.Hour:
		return fmt.Sprintf("%d min", d/time.Minute)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", d/time.Hour)
	}
	return fmt.Sprintf("%d days", d/(24*time.Hour))
}

// Limits of oldestWaiting's reads. A broker returns a partition's first
// record batch whole even when it is larger than the limits, but only for
// the first partition of a response that returns anything: a partition
// whose first batch is larger than waitingPartitionBytes, behind another,
// comes back empty, and is asked alone (at most waitingAlone of them).
const (
	waitingPartitionBytes = 64 << 10
	waitingResponseBytes  = 1 << 20
	waitingAlone          = 8
)

// oldestWaiting reads what the log holds at each partition's next offset
// (next): one Fetch request per partition leader, answered at once
// (MaxWait 0), of at most waitingPartitionBytes per partition and
// waitingResponseBytes in all, read committed as the workers read. A
// partition it could not read is left out.
func oldestWaiting(ctx context.Context, cl *kgo.Client, adm *kadm.Client, next map[tp]int64) map[tp]waitingJob {
	out := map[tp]waitingJob{}
	if len(next) == 0 {
		return out
	}
	var topics []string
	for k := range next {
		if !slices.Contains(topics, k.topic) {
			topics = append(topics, k.topic)
		}
	}
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		return out
	}
	byLeader := map[int32][]tp{}
	for k := range next {
		td, ok := md.Topics[k.topic]
		if !ok || td.Err != nil {
			continue
		}
		pd, ok := td.Partitions[k.partition]
		if !ok || pd.Err != nil || pd.Leader < 0 {
			continue
		}
		byLeader[pd.Leader] = append(byLeader[pd.Leader], k)
	}
	dec := kgo.DefaultDecompressor()
	var alone []tp
	for leader, parts := range byLeader {
		slices.SortFunc(parts, func(a, b tp) int {
			if c := strings.Compare(a.topic, b.topic); c != 0 {
				return c
			}
			return int(a.partition - b.partition)
		})
		got := fetchFirst(ctx, cl, leader, md.Topics, parts, next, waitingPartitionBytes, dec)
		for _, k := range parts {
			if w, ok := got[k]; ok {
				out[k] = w
			} else if len(alone) < waitingAlone {
				alone = append(alone, k)
			}
		}
	}
	for _, k := range alone {
		leader := md.Topics[k.topic].Partitions[k.partition].Leader
		if w, ok := fetchFirst(ctx, cl, leader, md.Topics, []tp{k}, next, 1, dec)[k]; ok {
			out[k] = w
		}
	}
	return out
}

// fetchFirst sends one Fetch request for parts to their leader and
// returns what it found at each one's next offset.
func fetchFirst(ctx context.Context, cl *kgo.Client, leader int32, topics kadm.TopicDetails, parts []tp, next map[tp]int64,
	partitionBytes int32, dec kgo.Decompressor) map[tp]waitingJob {
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis = 0
	req.MinBytes = 1
	req.MaxBytes = waitingResponseBytes
	req.IsolationLevel = 1 // read committed
	names := map[[16]byte]string{}
	at := map[string]int{}
	for _, k := range parts {
		i, ok := at[k.topic]
		if !ok {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = k.topic, topics[k.topic].ID
			names[rt.TopicID] = k.topic
			req.Topics = append(req.Topics, rt)
			i = len(req.Topics) - 1
			at[k.topic] = i
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = k.partition, next[k], partitionBytes
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	out := map[tp]waitingJob{}
	r, err := cl.Broker(int(leader)).Request(ctx, req)
	if err != nil {
		return out
	}
	resp, ok := r.(*kmsg.FetchResponse)
	if !ok || resp.ErrorCode != 0 {
		return out
	}
	for _, rt := range resp.Topics {
		topic := rt.Topic
		if topic == "" {
			topic = names[rt.TopicID] // v13 and later name topics by id
		}
		for i := range rt.Partitions {
			rp := &rt.Partitions[i]
			k := tp{topic, rp.Partition}
			off, asked := next[k]
			if !asked || rp.ErrorCode != 0 {
				continue
			}
			stable := rp.HighWatermark
			if rp.LastStableOffset >= 0 {
				stable = rp.LastStableOffset
			}
			var w waitingJob
			fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, IsolationLevel: kgo.ReadCommitted(),
				Topic: topic, Partition: rp.Partition}, rp, dec, nil)
			for _, rec := range fp.Records {
				if rec.Offset >= off {
					w.at = rec.Timestamp
					break
				}
			}
			switch {
			case !w.at.IsZero():
			case stable <= off, coveredEnd(rp.RecordBatches) >= stable:
				// Nothing readable below the stable offset, or every batch
				// up to it read without a job in it.
				w.none = true
			default:
				continue // the batches did not fit the limits: unknown
			}
			out[k] = w
		}
	}
	return out
}

// coveredEnd returns the offset after the last whole record batch in raw
// (the record batches of a fetch response; -1 if there is none, or the
// first is of a format before magic 2). The broker may cut the last batch
// short at the response's limit: a partial batch is not counted.
func coveredEnd(raw []byte) int64 {
	end := int64(-1)
	// A magic 2 batch: base offset (8 bytes), length (4), leader epoch (4),
	// magic (1), CRC (4), attributes (2), last offset delta (4), ...; its
	// header is 61 bytes.
	for len(raw) >= 61 {
		base := int64(binary.BigEndian.Uint64(raw[0:8]))
		length := int64(int32(binary.BigEndian.Uint32(raw[8:12])))
		if length < 49 || length > int64(len(raw)-12) || raw[16] != 2 {
			break
		}
		end = base + int64(int32(binary.BigEndian.Uint32(raw[23:27]))) + 1
		raw = raw[12+length:]
	}
	return end
}
