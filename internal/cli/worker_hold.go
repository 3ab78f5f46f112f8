package cli

import (
	"context"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// holdHooks implements --hold-once: the first time the lane reaches the
// named point it logs "holding" and blocks until the process receives
// SIGCONT. A demo or test sends SIGSTOP once it sees "holding" (the worker
// is now frozen exactly inside the window between reading jobs and
// committing them), and later SIGCONT, which both resumes the process and
// releases the hold. Nothing else changes: what happens next is what would
// happen to any worker paused at that point.
//
// before-claim holds after the coordinator confirmed the epoch and just
// before the claim statement (and, with --strict, before the claim
// resolves older prepared batches): the window a zombie of a reset group
// would be frozen in. before-claim:P holds there for partition P only.
//
// With --strict: strict-before-offset-commit holds after the batch is
// prepared, before its offset commit is built; strict-mid-offset-commit
// once the offset commit is built (member id and generation fixed) and
// logged as sent, before it is written to the coordinator: a request held
// in the network; strict-before-commit-prepared after the coordinator
// accepted it, before COMMIT PREPARED; strict-before-resolve when a claim
// is about to decide an older lane's prepared batch. Each holds once,
// except strict-before-offset-commit-every, which holds every lane that
// reaches it until SIGCONT (or until the lane is stopped hard).
func holdHooks(point string) (func(*zap.Logger) consumer.Hooks, error) {
	onlyPartition := int32(-1)
	if rest, ok := strings.CutPrefix(point, "before-claim:"); ok {
		n, err := strconv.ParseInt(rest, 10, 32)
		if err != nil || n < 0 {
			return nil, usagef("--hold-once %q: the partition after before-claim: is not a partition number", point)
		}
		point, onlyPartition = "before-claim", int32(n)
	}
	switch point {
	case "":
		return func(*zap.Logger) consumer.Hooks { return consumer.Hooks{} }, nil
	case "before-claim", "before-batch", "before-commit",
		"strict-before-offset-commit", "strict-mid-offset-commit", "strict-before-commit-prepared", "strict-before-resolve",
		"strict-before-offset-commit-every":
	default:
		return nil, usagef("--hold-once %q is not before-claim, before-claim:PARTITION, before-batch, before-commit, "+
			"strict-before-offset-commit, strict-mid-offset-commit, strict-before-commit-prepared, strict-before-resolve or strict-before-offset-commit-every", point)
	}
	return func(log *zap.Logger) consumer.Hooks {
		var once sync.Once
		hold := func(ctx context.Context, fields ...zap.Field) {
			once.Do(func() {
				cont := make(chan os.Signal, 1)
				signal.Notify(cont, syscall.SIGCONT)
				defer signal.Stop(cont)
				log.Info("holding", append(fields, zap.String("point", point), zap.Int("pid", os.Getpid()))...)
				select {
				case <-cont:
					log.Info("released", zap.String("point", point))
				case <-ctx.Done():
				}
			})
		}
		// every: strict-before-offset-commit-every holds each lane that
		// reaches it until the first SIGCONT after the first hold.
		var everyOnce sync.Once
		released := make(chan struct{})
		holdEvery := func(ctx context.Context, fields ...zap.Field) {
			everyOnce.Do(func() {
				cont := make(chan os.Signal, 1)
				signal.Notify(cont, syscall.SIGCONT)
				go func() {
					<-cont
					signal.Stop(cont)
					log.Info("released", zap.String("point", point))
					close(released)
				}()
			})
			log.Info("holding", append(fields, zap.String("point", point), zap.Int("pid", os.Getpid()))...)
			select {
			case <-released:
			case <-ctx.Done():
			}
		}
		batchFields := func(b *consumer.Batch) []zap.Field {
			return []zap.Field{zap.String("topic", b.Topic), zap.Int32("partition", b.Partition),
				zap.Stringer("token", b.Token), zap.Int64("from", b.From), zap.Int64("to", b.To)}
		}
		holdBatch := func(ctx context.Context, b *consumer.Batch) { hold(ctx, batchFields(b)...) }
		holdGID := func(ctx context.Context, b *consumer.Batch, gid string) {
			hold(ctx, append(batchFields(b), zap.String("gid", gid))...)
		}
		var h consumer.Hooks
		switch point {
		case "before-claim":
			h.BeforeClaim = func(ctx context.Context, p sink.Partition, t sink.Token) {
				if onlyPartition >= 0 && p.Partition != onlyPartition {
					return
				}
				hold(ctx, zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.Stringer("token", t))
			}
		case "before-batch":
			h.BeforeBatch = holdBatch
		case "before-commit":
			h.BeforeCommit = holdBatch
		case "strict-before-offset-commit":
			h.BeforeOffsetCommit = holdGID
		case "strict-before-offset-commit-every":
			h.BeforeOffsetCommit = func(ctx context.Context, b *consumer.Batch, gid string) {
				holdEvery(ctx, append(batchFields(b), zap.String("gid", gid))...)
			}
		case "strict-mid-offset-commit":
			h.OffsetCommitInFlight = holdGID
		case "strict-before-commit-prepared":
			h.BeforeCommitPrepared = holdGID
		case "strict-before-resolve":
			h.BeforeResolve = func(ctx context.Context, p sink.Partition, gid string) {
				hold(ctx, zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.String("gid", gid))
			}
		}
		return h
	}, nil
}
