// Package fence is the worker's protocol on Postgres: the fencing state,
// every statement on its tables (the fences, the fence log, holds, layouts,
// dead letters, incarnations, heartbeats, strict decisions), the claims and
// fenced commits that guard it, and the steps package consumer takes around
// them (Register,
// BumpIncarnation, CommitBatch, ResolveSession, EndStaleBlockers,
// HoldPartition, ClearStall, CheckLayout, AddDeadLetter, PruneFenceLog,
// Heartbeat, the strict mode's prepared batches, ...).
//
// It is internal so that the protocol is not API: its order, arguments and
// meaning follow docs/fencing.md and the model checks, and change with them
// in any release. Package sink is the public face: its types are aliases of
// this package's, and its Store offers the operator's API (reading the
// fencing state, holds, resets, dead letters, the fence log) by calling a
// *Store of this package that it does not re-export.
//
// Package consumer reaches that *Store with Of(store), where store is the
// *sink.Store its Config names: sink registers the accessor when it is
// initialised (fence cannot import sink, which imports it). A program
// outside this module cannot import fence, so it cannot call Of, and
// sink.Store does not embed, return or otherwise hand out the *Store:
// the protocol methods stay out of reach of everything but tenure's own
// packages.
package fence

import "sync/atomic"

var unwrap atomic.Pointer[func(any) *Store]

// SetAccessor is called by package sink's init with the function that
// returns the *Store inside a *sink.Store.
func SetAccessor(f func(any) *Store) { unwrap.Store(&f) }

// Of returns the protocol store behind store, a *sink.Store (nil for a nil
// store or any other value).
func Of(store any) *Store {
	f := unwrap.Load()
	if f == nil || store == nil {
		return nil
	}
	return (*f)(store)
}
