// Package consumer is tenure's worker runtime: a Kafka consumer group member
// that processes each assigned partition on its own lane and commits every
// batch through the fence in Postgres.
//
// The life of a partition on a worker, and the file that holds each step:
//
//  1. The group assigns it (consumer.go: the group session, its callbacks
//     and the poll loop). Before anything is fetched, the worker claims it
//     in Postgres with its token (claim.go: register, confirm, claim) and
//     starts fetching at the next offset stored there, after comparing the
//     stored offsets with the log (loginfo.go) and with the offsets mirrored
//     to Kafka (mirror.go). Kafka's committed offsets are not read, except as
//     the start of a partition Postgres has never seen.
//  2. Its lane (lane.go: the lane's loop) takes batches of consecutive
//     records from its buffer (buffer.go: what the poll loop hands it, checked
//     to continue the partition's fetch position) and runs each in a
//     transaction: Handler, fence, COMMIT (attempt.go), advancing the stored
//     next offset only if the token, claimant and log epoch still hold the
//     partition. How the transaction ends is the lane's committer, chosen
//     once as the lane starts (commit.go; strict.go for Config.Strict). A failing batch is retried, split, and its failing job
//     dead-lettered in the fenced transaction that moves past it
//     (attempt.go, errors.go); an older owner's session that holds locks the
//     batch waits for is ended (handoff.go).
//  3. On revoke the lane finishes its batch (bounded) and stops; on loss it
//     gets a short grace, then its context is cancelled. A commit already in
//     flight is not recalled: the fence settles it.
//  4. If a claim or commit is rejected (sink.ErrFenced), or the log moves
//     under the lane, the lane drops its buffered records and finds out by
//     itself whether it may go on: it claims again for its own assignment,
//     or holds the partition for an operator (recover.go).
//  5. If the handler ended its own transaction (ErrHandlerEndedTx), the
//     partition is halted, recorded in Postgres, until an operator resumes
//     it (lane.go: halt, awaitOperator).
//  6. If the worker cannot reach its database for Config.DatabaseTimeout,
//     it gives all its partitions up and joins the group again once the
//     database answers (dbwatch.go).
//
// The Handler gets a Tx (statements and savepoints, never Commit or Conn).
// Its errors are the job's (retries, split, dead letter) unless it says
// otherwise with Permanent (final at once) or Transient (retried, never
// dead-lettered), or a SQLSTATE says the environment is wrong (the partition
// stalls): see Handler for the full rule.
//
// Minimal use:
//
//	store, _ := sink.NewStore(pool, sink.DefaultSchema)
//	c, err := consumer.New(consumer.Config{
//		Brokers: []string{"127.0.0.1:9092"}, Group: "exports", Topics: []string{"export-jobs"},
//		Store: store,
//		Handler: consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
//			for _, r := range b.Records {
//				if _, err := tx.Exec(ctx, `INSERT INTO app.out (job, body) VALUES ($1, $2)`, consumer.JobID(r), r.Value); err != nil {
//					return err
//				}
//			}
//			return nil
//		}),
//	})
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx is cancelled; then a graceful stop
//
// Static group membership is refused (ErrStaticMembership): a restarted
// static member reuses its predecessor's epoch, so the epoch cannot fence the
// old process.
package consumer
