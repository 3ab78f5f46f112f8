// Package history checks tenure's guarantee over what Postgres recorded:
// the fence log (every accepted claim and commit), the export versions and
// the ledger. Tests and the chaos run load a history and call Check; the
// checks are pure functions so that they can be fed broken histories too.
package history

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// Entry is one accepted claim or commit, in the order Postgres applied them
// to the partition's fencing row (the row lock serialises them, so the log's
// id order is that order).
type Entry struct {
	ID        int64
	Kind      string // "claim", "commit", or "reset" (an operator's: Owner is the operator)
	Partition sink.Partition
	Token     sink.Token
	Owner     string
	ClaimID   int64 // the claimant (one lane); 0 if unknown
	From, To  int64
	// GID names the prepared transaction of a strict lane's commit
	// (Config.Strict; "" otherwise): the entry became visible with its
	// COMMIT PREPARED.
	GID string
}

// Assignment is the coordinator's side of one claimant: member was assigned
// the partition at At (as the member logged it when kgo handed it over), and
// ClaimID is the lane that then claimed it. Assignments of a partition are
// granted one after another: a later one means the coordinator had taken the
// partition from the earlier holder (revoked, or evicted it) by then.
type Assignment struct {
	ClaimID   int64
	Member    string
	Partition sink.Partition
	At        time.Time
}

// AssignmentLogMsg is the message of the line a worker logs when it was given
// a partition and is about to claim it (consumer's claim); with its fields
// topic, partition, member, claim_id and ts it is one Assignment.
const AssignmentLogMsg = consumer.MsgClaiming

// ParseAssignment reads an Assignment from a worker's JSON log line, as
// decoded into a map; ok is false for any other line.
func ParseAssignment(group string, line map[string]any) (a Assignment, ok bool) {
	if line["msg"] != AssignmentLogMsg {
		return a, false
	}
	p, id, at, ok := parseClaimLine(group, line)
	if !ok {
		return a, false
	}
	member, _ := line["member"].(string)
	return Assignment{ClaimID: id, Member: member, Partition: p, At: at}, true
}

// parseClaimLine reads what every line of a worker's log about one claim
// carries: the partition (of group), the claim id and when it was logged;
// ok is false when any of them is missing.
func parseClaimLine(group string, line map[string]any) (p sink.Partition, claimID int64, at time.Time, ok bool) {
	topic, _ := line["topic"].(string)
	part, ok1 := line["partition"].(float64)
	id, ok2 := line["claim_id"].(float64)
	ts, _ := line["ts"].(string)
	at, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts)
	if topic == "" || !ok1 || !ok2 || err != nil {
		return sink.Partition{}, 0, time.Time{}, false
	}
	return sink.Partition{Group: group, Topic: topic, Partition: int32(part)}, int64(id), at, true
}

// Write is one job's visible effect: an export version or a ledger row.
type Write struct {
	Key       string
	Version   int64 // export version of Key (0 for ledger rows)
	Topic     string
	Partition int32
	Offset    int64
	Token     sink.Token
}

// Violation is one broken promise.
type Violation struct {
	Rule   string // G1, G2, G3, export-regressed, duplicate, missing
	Detail string
}

func (v Violation) String() string { return v.Rule + ": " + v.Detail }

// History is everything recorded for one schema.
type History struct {
	Log    []Entry
	Fences []sink.Fence
	Writes []Write // export versions, or ledger rows
	// DeadLetters are the parked jobs (Key, Topic, Partition, Offset, Token).
	DeadLetters []Write
	// Cuts are the partitions whose fence log was pruned, and where.
	Cuts []sink.FenceLogCut
	// Publications and Pointers are the object-store export sink's records
	// (LoadObjectExports; empty otherwise).
	Publications []Publication
	Pointers     []ExportPointer
	// StrictDecisions are the recorded decisions on strict lanes' prepared
	// batches, and Prepared the GIDs still prepared (undecided) when the
	// history was loaded (CheckStrict).
	StrictDecisions []fence.StrictDecision
	Prepared        []string
}

// CheckLog verifies, per partition: commits cover consecutive offset ranges
// with no gap and no overlap, ending at the fencing row's next offset, and
// every claim resumes where the log had reached (G1); no commit carries a
// token lower than an earlier commit's (G2) or an earlier claim's (G3); and
// every commit is made by the latest claimant with the token it claimed with
// (G3: a claim fences everyone else at once, and only a claim sets a token).
// A fencing row with no history at all is reported too.
//
// A partition whose log was pruned (cuts, fence.Store.PruneFenceLog) is
// checked from the cut: the only entry at or below it is the claim that held
// the partition then (it sets the holder, not the offset), the entries after
// it resume at the cut's next offset, and no token after the cut may be below
// the highest token pruned.
//
// A reset (an operator moved the stored offset: `tenure admin offsets
// reset`, or an acknowledged hold) re-bases the partition: it must move the
// offset from where the log had reached, carry the token and claim id of
// the claim that held the fencing row, and come after a claim; the next
// commit must come after a claim that follows it (a reset starts a new log
// epoch, so a batch begun before it never commits after it: a commit that
// straddles a reset is reported even when its range happens to fit).
func CheckLog(log []Entry, fences []sink.Fence, cuts ...sink.FenceLogCut) []Violation {
	var out []Violation
	byPart := map[sink.Partition][]Entry{}
	for _, e := range log {
		byPart[e.Partition] = append(byPart[e.Partition], e)
	}
	cutOf := map[sink.Partition]sink.FenceLogCut{}
	for _, c := range cuts {
		cutOf[c.Partition] = c
	}
	final := map[sink.Partition]int64{}
	for _, f := range fences {
		final[f.Partition] = f.NextOffset
		if _, ok := byPart[f.Partition]; !ok {
			out = append(out, Violation{"G1", fmt.Sprintf("%s: the fencing row says next offset %d but no claim or commit was logged", f.Partition, f.NextOffset)})
		}
	}
	for p, es := range byPart {
		sort.Slice(es, func(i, j int) bool { return es[i].ID < es[j].ID })
		var (
			maxCommit, maxClaim sink.Token
			seenCommit          bool
			holder              *Entry // the latest claim
			reset               *Entry // the latest reset, until a claim follows it
			next                int64  = -1
		)
		cut, pruned := cutOf[p]
		if pruned {
			maxClaim, maxCommit, seenCommit = cut.MaxToken, cut.MaxToken, true
		}
		for i := range es {
			e := es[i]
			if pruned && e.ID <= cut.ThroughID {
				if e.ID != cut.KeptClaimID || e.Kind != "claim" {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: %s #%d is at or below the pruned cut #%d but is not its kept claim", p, e.Kind, e.ID, cut.ThroughID)})
					continue
				}
				holder = &es[i] // the claim that held the partition at the cut
				continue
			}
			if pruned && next < 0 {
				next = cut.NextOffset
			}
			switch e.Kind {
			case "reset":
				// An operator moved the stored offset (`tenure admin offsets
				// reset`), or acknowledged that it did not fit the log (a
				// re-created topic, a truncated log): the offsets continue
				// from To. The operator's record moves the offset from where
				// the log had reached, under the token and claim id of the
				// claim that held the fencing row, and starts a new log
				// epoch: no batch begun before it commits after it, so the
				// next commit comes after a claim that follows it.
				switch {
				case next < 0:
					out = append(out, Violation{"G1", fmt.Sprintf("%s: reset #%d from %d to %d before any claim: a reset moves a fencing row, which only a claim creates", p, e.ID, e.From, e.To)})
				case e.From != next:
					out = append(out, Violation{"G1", fmt.Sprintf("%s: reset #%d moved the offset from %d but the log had reached %d", p, e.ID, e.From, next)})
				}
				if holder != nil && (holder.Token != e.Token || holder.ClaimID != e.ClaimID) {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: reset #%d by %q carries token %s (claim %d) but the partition was held with token %s (claim %d)",
						p, e.ID, e.Owner, e.Token, e.ClaimID, holder.Token, holder.ClaimID)})
				}
				if e.To < 0 {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: reset #%d moved the offset to %d", p, e.ID, e.To)})
				}
				next = e.To
				reset = &es[i]
			case "claim":
				reset = nil
				if next < 0 {
					next = e.From
				} else if e.From != next {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: claim #%d resumed at %d but the log had reached %d", p, e.ID, e.From, next)})
				}
				if e.Token.Less(maxClaim) || e.Token.Less(maxCommit) {
					out = append(out, Violation{"G2", fmt.Sprintf("%s: claim #%d with token %s after token %s", p, e.ID, e.Token, maxToken(maxClaim, maxCommit))})
				}
				if holder != nil && holder.Token == e.Token && holder.Owner != e.Owner {
					out = append(out, Violation{"G3", fmt.Sprintf("%s: claim #%d by %q took token %s from %q", p, e.ID, e.Owner, e.Token, holder.Owner)})
				}
				if maxClaim.Less(e.Token) {
					maxClaim = e.Token
				}
				holder = &es[i]
			case "commit":
				if seenCommit && e.Token.Less(maxCommit) {
					out = append(out, Violation{"G2", fmt.Sprintf("%s: commit #%d [%d,%d) with token %s after a commit with token %s", p, e.ID, e.From, e.To, e.Token, maxCommit)})
				}
				switch {
				case e.Token.Less(maxClaim):
					out = append(out, Violation{"G3", fmt.Sprintf("%s: commit #%d [%d,%d) with token %s after a claim with token %s", p, e.ID, e.From, e.To, e.Token, maxClaim)})
				case holder == nil:
					out = append(out, Violation{"G3", fmt.Sprintf("%s: commit #%d [%d,%d) with token %s before any claim", p, e.ID, e.From, e.To, e.Token)})
				case holder.Token != e.Token || holder.Owner != e.Owner:
					out = append(out, Violation{"G3", fmt.Sprintf("%s: commit #%d [%d,%d) by %q with token %s while %q holds the partition with token %s",
						p, e.ID, e.From, e.To, e.Owner, e.Token, holder.Owner, holder.Token)})
				}
				if reset != nil {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: commit #%d [%d,%d) by %q straddles reset #%d (from %d to %d): no claim after the reset, so the batch was begun before it, in the log epoch the reset ended",
						p, e.ID, e.From, e.To, e.Owner, reset.ID, reset.From, reset.To)})
				}
				if next >= 0 && e.From != next {
					kind := "gap"
					if e.From < next {
						kind = "overlap"
					}
					out = append(out, Violation{"G1", fmt.Sprintf("%s: commit #%d [%d,%d) leaves a %s after %d", p, e.ID, e.From, e.To, kind, next)})
				}
				if e.To <= e.From {
					out = append(out, Violation{"G1", fmt.Sprintf("%s: commit #%d [%d,%d) does not advance", p, e.ID, e.From, e.To)})
				}
				next = e.To
				seenCommit = true
				if maxCommit.Less(e.Token) {
					maxCommit = e.Token
				}
			}
		}
		if pruned && next < 0 {
			next = cut.NextOffset
		}
		if f, ok := final[p]; ok && next >= 0 && f != next {
			out = append(out, Violation{"G1", fmt.Sprintf("%s: the log ends at %d but the fencing row says %d", p, next, f)})
		}
	}
	sortViolations(out)
	return out
}

// CheckOwnership checks the log against the coordinator's assignments: once
// the claim of a newer assignment of a partition has been accepted, nothing
// made for an older assignment (claim or commit) may be accepted, whatever
// its token says. Tokens can fail to order two lifetimes of a group (issue
// 7: a zombie's old epoch above the new lifetime's); this rule does not
// look at them. Entries whose claim id has no assignment are returned as
// unmatched, so that a caller can insist there are none.
func CheckOwnership(log []Entry, assignments []Assignment) (out []Violation, unmatched []Entry) {
	byClaim := map[int64]Assignment{}
	for _, a := range assignments {
		byClaim[a.ClaimID] = a
	}
	byPart := map[sink.Partition][]Entry{}
	for _, e := range log {
		byPart[e.Partition] = append(byPart[e.Partition], e)
	}
	for p, es := range byPart {
		sort.Slice(es, func(i, j int) bool { return es[i].ID < es[j].ID })
		var newest *Assignment // the newest assignment whose claim was accepted
		for _, e := range es {
			if e.Kind == "reset" {
				continue // an operator's, not a member's
			}
			a, ok := byClaim[e.ClaimID]
			if !ok || a.Partition != p {
				unmatched = append(unmatched, e)
				continue
			}
			if newest != nil && a.At.Before(newest.At) {
				out = append(out, Violation{"G3-owner", fmt.Sprintf("%s: %s #%d by %q (token %s, assigned %s) accepted after the claim of %q (assigned %s later)",
					p, e.Kind, e.ID, e.Owner, e.Token, a.At.Format("15:04:05.000"), newest.Member, newest.At.Sub(a.At).Round(time.Millisecond))})
			}
			if e.Kind == "claim" && (newest == nil || newest.At.Before(a.At)) {
				a := a
				newest = &a
			}
		}
	}
	sortViolations(out)
	return out, unmatched
}

func maxToken(a, b sink.Token) sink.Token {
	if a.Less(b) {
		return b
	}
	return a
}

// CheckWrites verifies that every job below its partition's next offset
// that exists in produced has exactly one write or exactly one dead letter
// (not both), that nothing exists at or beyond the next offset, and that per
// key the export versions' offsets only go forward. produced maps
// topic/partition to the offsets that hold jobs; nil skips the "missing"
// check.
func CheckWrites(writes, deadLetters []Write, fences []sink.Fence, produced map[TopicPartition][]int64) []Violation {
	var out []Violation
	next := map[TopicPartition]int64{}
	for _, f := range fences {
		next[TopicPartition{f.Topic, f.Partition.Partition}] = f.NextOffset
	}
	count := map[TopicPartition]map[int64]int{}
	byKey := map[topicKey][]Write{}
	for _, w := range writes {
		tp := TopicPartition{w.Topic, w.Partition}
		if count[tp] == nil {
			count[tp] = map[int64]int{}
		}
		count[tp][w.Offset]++
		if n, ok := next[tp]; !ok {
			out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: job at offset %d has a committed effect but the partition has no fencing row", w.Topic, w.Partition, w.Offset)})
		} else if w.Offset >= n {
			out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: job at offset %d has a committed effect but the next offset is %d", w.Topic, w.Partition, w.Offset, n)})
		}
		if w.Version > 0 {
			k := topicKey{w.Topic, w.Key}
			byKey[k] = append(byKey[k], w)
		}
	}
	dead := map[TopicPartition]map[int64]bool{}
	for _, d := range deadLetters {
		tp := TopicPartition{d.Topic, d.Partition}
		if count[tp] == nil {
			count[tp] = map[int64]int{}
		}
		if dead[tp] == nil {
			dead[tp] = map[int64]bool{}
		}
		switch {
		case dead[tp][d.Offset]:
			out = append(out, Violation{"duplicate", fmt.Sprintf("%s/%d: job at offset %d is dead-lettered twice", d.Topic, d.Partition, d.Offset)})
		case count[tp][d.Offset] > 0:
			out = append(out, Violation{"duplicate", fmt.Sprintf("%s/%d: job at offset %d is dead-lettered and has a committed effect", d.Topic, d.Partition, d.Offset)})
		}
		dead[tp][d.Offset] = true
		count[tp][d.Offset]++
		if n, ok := next[tp]; ok && d.Offset >= n {
			out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: job at offset %d is dead-lettered but the next offset is %d", d.Topic, d.Partition, d.Offset, n)})
		}
	}
	for tp, offs := range count {
		for off, n := range offs {
			if n > 1 {
				out = append(out, Violation{"duplicate", fmt.Sprintf("%s/%d: job at offset %d has %d committed effects or dead letters", tp.Topic, tp.Partition, off, n)})
			}
		}
	}
	for tp, offs := range produced {
		n := next[tp]
		for _, off := range offs {
			if off < n && count[tp][off] == 0 {
				out = append(out, Violation{"missing", fmt.Sprintf("%s/%d: job at offset %d is below the next offset %d but has no effect and no dead letter", tp.Topic, tp.Partition, off, n)})
			}
		}
	}
	for key, ws := range byKey {
		sort.Slice(ws, func(i, j int) bool { return ws[i].Version < ws[j].Version })
		for i := 1; i < len(ws); i++ {
			a, b := ws[i-1], ws[i]
			if b.Partition == a.Partition && b.Topic == a.Topic && b.Offset <= a.Offset {
				out = append(out, Violation{"export-regressed", fmt.Sprintf("key %q: version %d (offset %d, token %s) follows version %d (offset %d, token %s)",
					key.key, b.Version, b.Offset, b.Token, a.Version, a.Offset, a.Token)})
			}
		}
	}
	sortViolations(out)
	return out
}

// CheckWriteTokens matches each write and dead letter to the commit that
// covers its offset (from the log) and checks that it carries that commit's
// token: an effect written under another token was not committed by the
// fenced transaction it claims to belong to (a handler that committed on
// its own, or a write outside the batch's transaction).
//
// Writes below a pruned partition's cut (cuts) are not checked: the commits
// that covered them are gone.
func CheckWriteTokens(log []Entry, writes, deadLetters []Write, cuts ...sink.FenceLogCut) []Violation {
	prunedBelow := map[TopicPartition]int64{}
	for _, c := range cuts {
		prunedBelow[TopicPartition{c.Topic, c.Partition.Partition}] = c.NextOffset
	}
	type rng struct {
		from, to int64
		token    sink.Token
		id       int64
	}
	commits := map[TopicPartition][]rng{}
	for _, e := range log {
		if e.Kind == "commit" {
			tp := TopicPartition{e.Partition.Topic, e.Partition.Partition}
			commits[tp] = append(commits[tp], rng{e.From, e.To, e.Token, e.ID})
		}
	}
	for _, rs := range commits {
		sort.Slice(rs, func(i, j int) bool { return rs[i].from < rs[j].from })
	}
	var out []Violation
	check := func(what string, w Write) {
		if below, ok := prunedBelow[TopicPartition{w.Topic, w.Partition}]; ok && w.Offset < below {
			return
		}
		rs := commits[TopicPartition{w.Topic, w.Partition}]
		i := sort.Search(len(rs), func(i int) bool { return rs[i].to > w.Offset })
		switch {
		case i == len(rs) || rs[i].from > w.Offset:
			out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: %s of the job at offset %d (token %s) is covered by no commit", w.Topic, w.Partition, what, w.Offset, w.Token)})
		case rs[i].token != w.Token:
			out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: %s of the job at offset %d carries token %s but commit #%d [%d,%d) that covers it has token %s",
				w.Topic, w.Partition, what, w.Offset, w.Token, rs[i].id, rs[i].from, rs[i].to, rs[i].token)})
		}
	}
	for _, w := range writes {
		check("the effect", w)
	}
	for _, d := range deadLetters {
		check("the dead letter", d)
	}
	sortViolations(out)
	return out
}

// topicKey is what an export version counts within: the export handler
// keeps a row per group, topic and key (migration 017), and a History is
// one group's.
type topicKey struct{ topic, key string }

// TopicPartition names a partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

func sortViolations(v []Violation) {
	sort.Slice(v, func(i, j int) bool {
		if v[i].Rule != v[j].Rule {
			return v[i].Rule < v[j].Rule
		}
		return v[i].Detail < v[j].Detail
	})
}

// Load reads schema's history for group: the fence log, the fencing rows and
// the export versions (ledger rows instead when ledger is true).
func Load(ctx context.Context, pool *pgxpool.Pool, schema, group string, ledger bool) (*History, error) {
	if err := sink.ValidateSchema(schema); err != nil {
		return nil, err
	}
	q := pgx.Identifier{schema}.Sanitize()
	h := &History{}
	store, err := fence.NewStore(pool, schema) // the protocol's reads too (cuts, strict decisions)
	if err != nil {
		return nil, err
	}
	log, err := store.FenceLog(ctx, group)
	if err != nil {
		return nil, err
	}
	for _, e := range log {
		h.Log = append(h.Log, Entry{ID: e.ID, Kind: e.Kind, Partition: e.Partition, Token: e.Token, Owner: e.Owner,
			ClaimID: e.ClaimID, From: e.From, To: e.To, GID: e.GID})
	}
	if h.Fences, err = store.List(ctx, group); err != nil {
		return nil, err
	}
	if h.Cuts, err = store.FenceLogCuts(ctx, group); err != nil {
		return nil, err
	}
	if h.StrictDecisions, err = store.LoadStrictDecisions(ctx, group); err != nil {
		return nil, err
	}
	if h.Prepared, err = store.PreparedGIDs(ctx, group); err != nil {
		return nil, err
	}
	// The export versions of group only (a row per group since migration
	// 017); the ledger does not record groups.
	sql, args := `SELECT job_key, version, topic, partition, job_offset, incarnation, epoch FROM `+q+`.export_versions WHERE consumer_group = $1`, []any{group}
	if ledger {
		sql, args = `SELECT job_key, 0, topic, partition, job_offset, incarnation, epoch FROM `+q+`.ledger`, nil
	}
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var w Write
	if _, err := pgx.ForEachRow(rows, []any{&w.Key, &w.Version, &w.Topic, &w.Partition, &w.Offset, &w.Token.Incarnation, &w.Token.Epoch}, func() error {
		h.Writes = append(h.Writes, w)
		return nil
	}); err != nil {
		return nil, err
	}
	dls, err := store.DeadLetters(ctx, sink.DeadLetterFilter{Group: group, Limit: math.MaxInt32})
	if err != nil {
		return nil, err
	}
	for _, d := range dls {
		h.DeadLetters = append(h.DeadLetters, Write{Key: escapeBytea(d.Key), Topic: d.Partition.Topic, Partition: d.Partition.Partition,
			Offset: d.Offset, Token: d.Token})
	}
	return h, nil
}

// escapeBytea is Postgres' encode(key, 'escape'), the text the export and
// ledger tables compare keys as: a backslash doubled, a zero byte or one
// with the high bit set as a backslash and three octal digits.
func escapeBytea(key []byte) string {
	var b strings.Builder
	for _, c := range key {
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c == 0 || c >= 0x80:
			fmt.Fprintf(&b, `\%03o`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Check runs every check over h that needs no more than Postgres recorded.
// CheckOwnership needs the coordinator's side too: callers that recorded
// the assignments run it as well.
//
// Partitions whose log holds an operator's reset are checked against the
// log's commits instead (CheckWritesAcrossResets): a reset back over jobs
// runs them again, one forward skips them.
func (h *History) Check(produced map[TopicPartition][]int64) []Violation {
	out := CheckLog(h.Log, h.Fences, h.Cuts...)
	resets := ResetPartitions(h.Log)
	writes, resetWrites := splitWrites(h.Writes, resets)
	dead, resetDead := splitWrites(h.DeadLetters, resets)
	var plain, across map[TopicPartition][]int64
	if produced != nil {
		plain, across = map[TopicPartition][]int64{}, map[TopicPartition][]int64{}
		for tp, offs := range produced {
			if resets[tp] {
				across[tp] = offs
			} else {
				plain[tp] = offs
			}
		}
	}
	out = append(out, CheckWrites(writes, dead, h.Fences, plain)...)
	out = append(out, CheckWriteTokens(h.Log, writes, dead, h.Cuts...)...)
	if len(resets) > 0 {
		out = append(out, CheckWritesAcrossResets(h.Log, resetWrites, resetDead, h.Fences, across, h.Cuts...)...)
	}
	if len(h.Publications) > 0 || len(h.Pointers) > 0 {
		out = append(out, CheckPointers(h.Publications, h.Pointers)...)
	}
	return out
}

// ResetPartitions are the partitions whose log holds an operator's reset.
func ResetPartitions(log []Entry) map[TopicPartition]bool {
	out := map[TopicPartition]bool{}
	for _, e := range log {
		if e.Kind == "reset" {
			out[TopicPartition{e.Partition.Topic, e.Partition.Partition}] = true
		}
	}
	return out
}

func splitWrites(ws []Write, resets map[TopicPartition]bool) (plain, across []Write) {
	for _, w := range ws {
		if resets[TopicPartition{w.Topic, w.Partition}] {
			across = append(across, w)
		} else {
			plain = append(plain, w)
		}
	}
	return plain, across
}

// CheckWritesAcrossResets is CheckWrites and CheckWriteTokens for
// partitions whose offsets an operator moved (ResetPartitions): a reset back
// over jobs runs them again, so a job may have several effects, and one
// forward leaves jobs without any. What must hold is that each job has
// exactly one effect or dead letter per commit that covered it, each with
// that commit's token (a job run twice has two, one per run); that a job
// produced below the next offset that no commit covered was skipped by a
// reset forward over it ("missing" otherwise); and that a key's export
// versions go back only to a job a reset moved the offsets back over.
//
// Writes and jobs below a pruned partition's cut are not checked: the
// commits that covered them are gone.
func CheckWritesAcrossResets(log []Entry, writes, deadLetters []Write, fences []sink.Fence, produced map[TopicPartition][]int64, cuts ...sink.FenceLogCut) []Violation {
	prunedBelow := map[TopicPartition]int64{}
	for _, c := range cuts {
		prunedBelow[TopicPartition{c.Topic, c.Partition.Partition}] = c.NextOffset
	}
	next := map[TopicPartition]int64{}
	for _, f := range fences {
		next[TopicPartition{f.Topic, f.Partition.Partition}] = f.NextOffset
	}
	type count map[sink.Token]int
	covered := map[TopicPartition]map[int64]count{} // commits covering each offset, by token
	written := map[TopicPartition]map[int64]count{} // effects and dead letters at each offset, by token
	var skips, repeats = map[TopicPartition][]Entry{}, map[TopicPartition][]Entry{}
	for _, e := range log {
		tp := TopicPartition{e.Partition.Topic, e.Partition.Partition}
		switch {
		case e.Kind == "commit":
			if covered[tp] == nil {
				covered[tp] = map[int64]count{}
			}
			for o := e.From; o < e.To; o++ {
				if covered[tp][o] == nil {
					covered[tp][o] = count{}
				}
				covered[tp][o][e.Token]++
			}
		case e.Kind == "reset" && e.To > e.From:
			skips[tp] = append(skips[tp], e)
		case e.Kind == "reset" && e.To < e.From:
			repeats[tp] = append(repeats[tp], e)
		}
	}
	below := func(tp TopicPartition, o int64) bool {
		b, ok := prunedBelow[tp]
		return ok && o < b
	}
	for _, w := range append(append([]Write(nil), writes...), deadLetters...) {
		tp := TopicPartition{w.Topic, w.Partition}
		if below(tp, w.Offset) {
			continue
		}
		if written[tp] == nil {
			written[tp] = map[int64]count{}
		}
		if written[tp][w.Offset] == nil {
			written[tp][w.Offset] = count{}
		}
		written[tp][w.Offset][w.Token]++
	}
	var out []Violation
	for tp, offs := range written {
		for o, got := range offs {
			want := covered[tp][o]
			if len(want) == 0 {
				out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: job at offset %d has a committed effect or dead letter but no commit covers it", tp.Topic, tp.Partition, o)})
				continue
			}
			for t, n := range got {
				switch {
				case want[t] == 0:
					out = append(out, Violation{"G1", fmt.Sprintf("%s/%d: job at offset %d has an effect or dead letter with token %s but no commit with that token covers it", tp.Topic, tp.Partition, o, t)})
				case n > want[t]:
					out = append(out, Violation{"duplicate", fmt.Sprintf("%s/%d: job at offset %d has %d effects or dead letters with token %s but %d commits with that token cover it", tp.Topic, tp.Partition, o, n, t, want[t])})
				}
			}
		}
	}
	for tp, offs := range produced {
		for _, o := range offs {
			if below(tp, o) {
				continue
			}
			want := covered[tp][o]
			if len(want) == 0 {
				if n, ok := next[tp]; ok && o < n && !slices.ContainsFunc(skips[tp], func(r Entry) bool { return r.From <= o && o < r.To }) {
					out = append(out, Violation{"missing", fmt.Sprintf("%s/%d: job at offset %d is below the next offset %d but no commit covers it and no reset skipped it", tp.Topic, tp.Partition, o, n)})
				}
				continue
			}
			got := written[tp][o]
			for t, n := range want {
				if got[t] < n {
					out = append(out, Violation{"missing", fmt.Sprintf("%s/%d: job at offset %d is covered by %d commits with token %s but has %d effects or dead letters with it", tp.Topic, tp.Partition, o, n, t, got[t])})
				}
			}
		}
	}
	byKey := map[topicKey][]Write{}
	for _, w := range writes {
		if w.Version > 0 {
			k := topicKey{w.Topic, w.Key}
			byKey[k] = append(byKey[k], w)
		}
	}
	for key, ws := range byKey {
		sort.Slice(ws, func(i, j int) bool { return ws[i].Version < ws[j].Version })
		for i := 1; i < len(ws); i++ {
			a, b := ws[i-1], ws[i]
			if b.Partition != a.Partition || b.Topic != a.Topic || b.Offset > a.Offset {
				continue
			}
			tp := TopicPartition{b.Topic, b.Partition}
			if slices.ContainsFunc(repeats[tp], func(r Entry) bool { return r.To <= b.Offset && a.Offset < r.From }) {
				continue // a reset moved the offsets back over both: b ran again after a
			}
			out = append(out, Violation{"export-regressed", fmt.Sprintf("key %q: version %d (offset %d, token %s) follows version %d (offset %d, token %s)",
				key.key, b.Version, b.Offset, b.Token, a.Version, a.Offset, a.Token)})
		}
	}
	sortViolations(out)
	return out
}
