// Package consumer is tenure's worker runtime: a Kafka consumer group member
// that processes each assigned partition on its own lane and commits every
// batch through the fence in Postgres.
//
// The life of a partition on a worker:
//
//  1. The group assigns it. Before anything is fetched, the worker claims it
//     in Postgres with its token (the classic generation, or the KIP-848
//     member epoch at which it was assigned) and starts fetching at the next
//     offset stored there. Kafka's committed offsets are not read, except as
//     the start of a partition Postgres has never seen.
//  2. Its lane hands batches of consecutive records, in offset order, to the
//     Handler inside a transaction, then advances the stored next offset in the
//     same transaction, only if the token and owner still hold the partition.
//  3. On revoke the lane finishes its batch (bounded) and stops; on loss it
//     gets a short grace, then its context is cancelled. A commit already in
//     flight is not recalled: the fence settles it.
//  4. If a claim or commit is rejected (sink.ErrFenced), the lane drops its
//     buffered records and the partition stays paused on this worker until
//     the group assigns it again.
//  5. If the handler ended its own transaction (ErrHandlerEndedTx), the
//     partition is halted, recorded in Postgres, until an operator resumes
//     it.
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
