package fence

import (
	"errors"
	"fmt"
)

// ErrFenced is matched (errors.Is) by every error that means "this
// claimant no longer owns the partition": its claim or commit was rejected
// because another token or owner holds the fencing row. The transaction it
// belonged to has been, or must be, rolled back. The right reaction is to drop
// the partition's buffered records and stop processing it until the group
// assigns it again.
var ErrFenced = errors.New("fenced")

// ErrOffsetMismatch is matched by a commit whose token and owner still hold
// the row but whose starting offset is not the stored next offset. It means
// the caller's view of its own progress is wrong (a bug, or a commit whose
// outcome it did not learn); the partition must be claimed again to resume
// from the stored offset. It also matches ErrFenced, because the reaction is
// the same: drop buffered records and re-read from the stored offset.
var ErrOffsetMismatch = errors.New("offset mismatch")

// FencedError says which claim or commit was rejected and what won.
type FencedError struct {
	Op        string // "claim" or "commit"
	Partition Partition
	Presented Token
	Owner     string
	ClaimID   int64 // the caller's claim id
	From      int64 // the next offset the caller believed in (commit only)
	LogEpoch  int64 // the log epoch the caller committed in (commit only)

	// What the fencing row held when the rejection was inspected. Found is
	// false if the row does not exist (it was deleted by an operator).
	Found           bool
	Current         Token
	CurrentOwner    string
	CurrentClaim    int64
	NextOffset      int64
	CurrentLogEpoch int64

	// StaleIncarnation (claims only): the claim's incarnation is not the
	// group's current one, GroupIncarnation; the claimant must register
	// again.
	StaleIncarnation bool
	GroupIncarnation int64
}

func (e *FencedError) Error() string {
	if e.StaleIncarnation {
		held := ""
		if e.Found {
			held = fmt.Sprintf("; token %s held by %q (next offset %d)", e.Current, e.CurrentOwner, e.NextOffset)
		}
		return fmt.Sprintf("%s of %s with token %s by %q rejected: incarnation %d is not the group's current one (%d)%s",
			e.Op, e.Partition, e.Presented, e.Owner, e.Presented.Incarnation, e.GroupIncarnation, held)
	}
	if !e.Found {
		return fmt.Sprintf("%s of %s with token %s by %q rejected: no fencing row (deleted?)",
			e.Op, e.Partition, e.Presented, e.Owner)
	}
	if e.mismatch() {
		if e.CurrentLogEpoch != e.LogEpoch {
			return fmt.Sprintf("%s of %s with token %s by %q rejected: the partition's offsets were moved to a new log epoch (%d, from %d: an operator's acknowledgement or offset reset); the stored next offset is %d",
				e.Op, e.Partition, e.Presented, e.Owner, e.CurrentLogEpoch, e.LogEpoch, e.NextOffset)
		}
		return fmt.Sprintf("%s of %s with token %s by %q rejected: it started at offset %d but the stored next offset is %d",
			e.Op, e.Partition, e.Presented, e.Owner, e.From, e.NextOffset)
	}
	if e.Superseded() {
		return fmt.Sprintf("%s of %s with token %s by %q (claim %d) rejected: a newer lane of the same member holds it (claim %d, token %s)",
			e.Op, e.Partition, e.Presented, e.Owner, e.ClaimID, e.CurrentClaim, e.Current)
	}
	if e.Tie() {
		return fmt.Sprintf("%s of %s with token %s by %q rejected: another claim of %q holds the same token (next offset %d)",
			e.Op, e.Partition, e.Presented, e.Owner, e.CurrentOwner, e.NextOffset)
	}
	return fmt.Sprintf("%s of %s with token %s by %q rejected: token %s held by %q won (next offset %d)",
		e.Op, e.Partition, e.Presented, e.Owner, e.Current, e.CurrentOwner, e.NextOffset)
}

// Tie reports whether the row holds the very token presented, claimed by
// another claimant (another member, or another lane of the same member).
func (e *FencedError) Tie() bool {
	return e.Found && !e.StaleIncarnation && e.Current == e.Presented && (e.CurrentOwner != e.Owner || e.CurrentClaim != e.ClaimID)
}

// Superseded reports whether a newer lane of the caller's own member holds
// the row (same owner, a higher claim id): the caller's assignment of the
// partition has ended, and it must not claim again.
func (e *FencedError) Superseded() bool {
	return e.Found && e.CurrentOwner == e.Owner && e.CurrentClaim > e.ClaimID
}

func (e *FencedError) mismatch() bool {
	return e.Op == "commit" && e.Found && e.Current == e.Presented && e.CurrentOwner == e.Owner && e.CurrentClaim == e.ClaimID
}

// Is makes errors.Is(err, ErrFenced) true, and ErrOffsetMismatch true when the
// token still held but the offset did not.
func (e *FencedError) Is(target error) bool {
	return target == ErrFenced || (target == ErrOffsetMismatch && e.mismatch())
}
