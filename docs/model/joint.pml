/*
 * One Postgres transaction over several partitions ("joint commits"),
 * model-checked with spin.
 *
 * A worker commits the ready batches of several of its lanes in one
 * transaction: each lane's handler output (inside a savepoint of its own),
 * then ONE fence statement that checks every partition's claim and offset
 * and moves them all, then COMMIT. If the statement refuses any partition
 * it fails, and with it the transaction: nothing of it becomes visible; the
 * refused lane stops (it recovers as docs/model/ownership.pml shows) and the
 * others go again without it. When the answer to COMMIT is lost, each lane
 * resolves its own partition (fence.Store.ResolveSession: wait until the
 * transaction is over, ending its session if it sits idle in it; then the
 * fence log, then the fencing row).
 *
 * Two partitions (0 and 1), two worker processes. Both partitions start
 * with worker 0; the coordinator moves either of them to the other worker,
 * at any moment, up to MAXMOVE times in all (a partition can come back).
 * A moved partition's new holder claims it; the old holder's lane runs on
 * (a zombie) until the fence refuses it. Every step is one atomic action,
 * so a worker paused between any two of its steps is one of the
 * interleavings spin explores: between its handlers and the fence
 * statement, between the fence statement and COMMIT, and while its session
 * is ended from outside.
 *
 * Postgres is: per partition the fencing row (the claim that holds it, the
 * next offset) and its row lock; per job the visible output rows; the fence
 * log (ghost: the claim whose commit covered each job); per worker its one
 * open transaction. A row locked by another transaction blocks a claim of
 * it and a fence statement that moves it, until that transaction ends.
 *
 * Abstractions:
 * - the claim protocol (register, confirm, bump, claim) is the claim
 *   statement alone: it accepts a claim of any assignment newer than the
 *   row's claim (what docs/model/ownership.pml proves of the real one);
 *   claim ids are assignment numbers, in coordinator order;
 * - a batch is one job; its output is one row;
 * - a refused lane stops (no recovery here: the model of that is
 *   ownership.pml's); a new assignment of the partition to the same worker
 *   is a new lane;
 * - a session ended from outside (MAXEND in all) is allowed at any moment
 *   while its transaction is open: the new owner's lock watch ending a
 *   paused worker's session (consumer/handoff.go), the idle timeout, a
 *   connection broken by the network, the resolver's own
 *   pg_terminate_backend. Ending it at any moment covers each of them;
 * - the fence statement takes its row locks all at once (Postgres takes
 *   them row by row: two statements that lock overlapping rows in opposite
 *   orders deadlock, and Postgres aborts one of them, an error its worker
 *   retries);
 * - a handler failure (MAXFAIL in all) rolls back to the lane's savepoint:
 *   the lane's output is gone and it is left out of the fence statement;
 *   the lane goes again later (the split and dead-letter path is not
 *   modeled).
 *
 * Builds (runs: scripts/model-check.sh):
 *   default        the joint commit as tenure runs it: must pass
 *   -DPERROW       the fence statement checks row by row: it moves the rows
 *                  that pass and refuses the others without failing, and
 *                  COMMIT commits the whole transaction, the refused lane's
 *                  output with the others': must FAIL
 *   -DMOVEFAILED   a lane whose handler failed (rolled back to its
 *                  savepoint) is kept in the fence statement: must FAIL
 *   -DNOLOCK       the fence statement takes no row locks (a claim can land
 *                  between it and COMMIT): must FAIL
 *
 * Properties (assertions, checked whenever a transaction commits):
 *   G1  for every partition and job: the job's output is visible exactly
 *       once if the job is below the stored next offset, and not at all
 *       otherwise (output and offset commit together; nothing of a refused
 *       transaction becomes visible); and the visible output of a job was
 *       written by the lane whose commit moved the offset over it;
 *   G3  a commit moves the offset only for the claim that holds the row
 *       when it commits (no output of a non-owner becomes visible), and
 *       only from where the row stood, by one batch.
 *   END once nothing can move, no transaction is open and no row is locked.
 * Every loop is bounded (MAXTX transactions per worker), so every run ends.
 */

#define NW 2            /* worker processes */
#define NP 2            /* partitions */
#ifndef MAXOFF
#define MAXOFF 2        /* jobs per partition */
#endif
#ifndef MAXMOVE
#define MAXMOVE 2       /* partition moves in all */
#endif
#ifndef MAXLOSS
#define MAXLOSS 1       /* lost COMMIT answers in all */
#endif
#ifndef MAXEND
#define MAXEND 1        /* sessions ended from outside in all */
#endif
#ifndef MAXFAIL
#define MAXFAIL 1       /* handler failures in all */
#endif
#ifndef MAXTX
#define MAXTX 4         /* transactions begun per worker */
#endif

#define L(w, x) ((w) * NP + (x))        /* worker w's lane of partition x */
#define J(x, o) ((x) * MAXOFF + (o))    /* the job at offset o of partition x */

/* a worker's transaction */
#define NOTX 0
#define OPEN 1          /* open (the session may sit idle in it) */
#define COMMITTING 2    /* COMMIT arrived at the server, not yet applied */
#define COMMITTED 3
#define ABORTED 4       /* its session was ended */

/* a lane */
#define NOLANE 0
#define READY 1         /* holds a claim; its next batch starts at pos */
#define INTX 2          /* its batch is in its worker's open transaction */
#define RESOLVING 3     /* COMMIT's answer was lost: it resolves its partition */
#define REFUSED 4       /* the fence refused it: it stops */

/* ---- the coordinator ---- */
byte holder[NP];        /* the worker each partition is assigned to */
byte asgN[NP];          /* assignments of each partition so far */
byte asgOf[NW * NP];    /* per worker: its newest assignment of each partition */
byte moves = 0;

/* ---- Postgres, as committed ---- */
byte rClaim[NP];        /* the claim that holds the fencing row (0: none) */
byte next[NP];          /* the stored next offset */
byte lock[NP];          /* w + 1 of the transaction holding the row's lock */
byte out[NP * MAXOFF];  /* visible output rows of each job */
byte outBy[NP * MAXOFF];/* the claim of the lane that wrote them */
byte logBy[NP * MAXOFF];/* the fence log: the claim whose commit covered the job */

/* ---- each worker's transaction ---- */
byte txSt[NW];
bool fenced[NW];        /* its fence statement has passed */
bool sent[NW];          /* COMMIT was sent, its answer lost */
bool wrote[NW * NP];    /* the lane's output is in the transaction */
bool failed[NW * NP];   /* the lane's handler failed: rolled back to its savepoint */
bool moved[NW * NP];    /* the fence statement moved the lane's row */

/* ---- each worker's lanes ---- */
byte st[NW * NP];
byte claim[NW * NP];    /* the lane's claim id */
byte pos[NW * NP];      /* the offset of its next batch */
byte handled[NW * NP];  /* the newest assignment the worker has claimed for */

/* ---- bounds used ---- */
byte losses = 0;
byte ends = 0;
byte fails = 0;

/* In the fence statement: a lane in the transaction whose handler did not
   fail (-DMOVEFAILED: every lane in the transaction). */
#ifdef MOVEFAILED
#define INFENCE(w, x) (st[L(w, x)] == INTX)
#else
#define INFENCE(w, x) (st[L(w, x)] == INTX && !failed[L(w, x)])
#endif
#define PASSES(w, x) (rClaim[x] == claim[L(w, x)] && next[x] == pos[L(w, x)])
#ifdef NOLOCK
#define FREE(w, x) true
#define LOCKROW(w, x) skip
#else
#define FREE(w, x) (!INFENCE(w, x) || lock[x] == 0)
#define LOCKROW(w, x) lock[x] = w + 1
#endif
#define READYLANE(w, x) (st[L(w, x)] == READY && pos[L(w, x)] < MAXOFF)

/* G1 over everything visible. */
inline check() {
	for (cx : 0 .. NP - 1) {
		for (co : 0 .. MAXOFF - 1) {
			/* say what broke before the assertion does */
			if
			:: co < next[cx] && out[J(cx, co)] != 1 ->
				printf("postgres: job %d.%d is below the next offset %d but has %d visible output rows\n", cx, co, next[cx], out[J(cx, co)])
			:: co < next[cx] && out[J(cx, co)] == 1 && outBy[J(cx, co)] != logBy[J(cx, co)] ->
				printf("postgres: job %d.%d's visible output is claim %d's, its commit claim %d's\n", cx, co, outBy[J(cx, co)], logBy[J(cx, co)])
			:: co >= next[cx] && out[J(cx, co)] != 0 ->
				printf("postgres: job %d.%d's output is visible but the next offset is %d\n", cx, co, next[cx])
			:: else -> skip
			fi;
			if
			:: co < next[cx] ->
				assert(out[J(cx, co)] == 1);
				assert(outBy[J(cx, co)] == logBy[J(cx, co)])
			:: else ->
				assert(out[J(cx, co)] == 0)
			fi
		}
	}
}

/* The transaction of worker w commits: its output becomes visible, the rows
   its fence statement moved move, their locks go. */
inline apply(w) {
	for (ax : 0 .. NP - 1) {
		if
		:: wrote[L(w, ax)] ->
			out[J(ax, pos[L(w, ax)])]++;
			outBy[J(ax, pos[L(w, ax)])] = claim[L(w, ax)];
			printf("postgres: worker %d's transaction commits: output of job %d.%d (claim %d) visible\n", w, ax, pos[L(w, ax)], claim[L(w, ax)])
		:: else -> skip
		fi;
		if
		:: moved[L(w, ax)] ->
			assert(rClaim[ax] == claim[L(w, ax)]);   /* G3 */
			assert(next[ax] == pos[L(w, ax)]);       /* G1: from where it stood */
			next[ax]++;
			logBy[J(ax, pos[L(w, ax)])] = claim[L(w, ax)];
			printf("postgres: worker %d's transaction commits: offset of partition %d moves to %d (claim %d)\n", w, ax, next[ax], claim[L(w, ax)])
		:: else -> skip
		fi;
		if
		:: lock[ax] == w + 1 -> lock[ax] = 0
		:: else -> skip
		fi;
		wrote[L(w, ax)] = false; moved[L(w, ax)] = false
	}
	check()
}

/* The transaction of worker w ends without committing: nothing of it was
   ever visible; its locks go. */
inline abort(w) {
	for (bx : 0 .. NP - 1) {
		if
		:: lock[bx] == w + 1 -> lock[bx] = 0
		:: else -> skip
		fi;
		wrote[L(w, bx)] = false; moved[L(w, bx)] = false
	}
}

/* The transaction of worker w is over for the worker: forget it. */
inline forget(w) {
	txSt[w] = NOTX; fenced[w] = false; sent[w] = false;
	for (fx : 0 .. NP - 1) {
		failed[L(w, fx)] = false
	}
}

/* Claim the newest assignment of x to w: the claim statement, in a session
   of its own (beside the worker's transaction), waits for the row's lock. */
inline claimOpt(x) {
	atomic {
		asgOf[L(w, x)] > handled[L(w, x)] && lock[x] == 0 && st[L(w, x)] != INTX && st[L(w, x)] != RESOLVING ->
		handled[L(w, x)] = asgOf[L(w, x)];
		if
		:: handled[L(w, x)] > rClaim[x] ->
			rClaim[x] = handled[L(w, x)];
			claim[L(w, x)] = handled[L(w, x)]; pos[L(w, x)] = next[x]; st[L(w, x)] = READY;
			printf("postgres: claim %d of partition %d by worker %d accepted at offset %d\n", handled[L(w, x)], x, w, next[x])
		:: else ->
			printf("postgres: claim %d of partition %d by worker %d rejected\n", handled[L(w, x)], x, w)
		fi
	}
}

/* The handler of lane x runs in its savepoint: its output is written, or it
   fails and the savepoint is rolled back. */
inline handleOpt(x) {
	atomic {
		txSt[w] == OPEN && !fenced[w] && st[L(w, x)] == INTX && !wrote[L(w, x)] && !failed[L(w, x)] ->
		if
		:: wrote[L(w, x)] = true;
			printf("worker %d: handler writes job %d.%d (claim %d)\n", w, x, pos[L(w, x)], claim[L(w, x)])
		:: fails < MAXFAIL -> fails++; failed[L(w, x)] = true;
			printf("worker %d: handler of job %d.%d fails: rolled back to its savepoint\n", w, x, pos[L(w, x)])
		fi
	}
}

/* A lane whose COMMIT answer was lost resolves its own partition: it waits
   until the transaction is over (a COMMIT still being processed is waited
   for; a session idle in the transaction is ended), then the fence log says
   whether its commit is there; if not, the row says whether it may go again
   (it still holds the row at its batch's start) or is refused. */
inline resolveOpt(x) {
	atomic {
		st[L(w, x)] == RESOLVING && txSt[w] != COMMITTING ->
		if
		:: txSt[w] == OPEN -> txSt[w] = ABORTED; abort(w);
			printf("worker %d: resolving: ends its idle session\n", w)
		:: else -> skip
		fi;
		if
		:: logBy[J(x, pos[L(w, x)])] == claim[L(w, x)] ->
			printf("worker %d: resolves job %d.%d: committed\n", w, x, pos[L(w, x)]);
			pos[L(w, x)]++; st[L(w, x)] = READY
		:: logBy[J(x, pos[L(w, x)])] != claim[L(w, x)] && PASSES(w, x) ->
			printf("worker %d: resolves job %d.%d: not committed, goes again\n", w, x, pos[L(w, x)]);
			st[L(w, x)] = READY
		:: logBy[J(x, pos[L(w, x)])] != claim[L(w, x)] && !PASSES(w, x) ->
			printf("worker %d: resolves job %d.%d: refused\n", w, x, pos[L(w, x)]);
			st[L(w, x)] = REFUSED
		fi;
		if
		:: st[L(w, 0)] != RESOLVING && st[L(w, 1)] != RESOLVING -> forget(w)
		:: else -> skip
		fi
	}
}

/* After the transaction ended, each of its lanes: to (go again, or resolve) */
inline settle(w, to) {
	for (sx : 0 .. NP - 1) {
		if
		:: st[L(w, sx)] == INTX && !failed[L(w, sx)] -> st[L(w, sx)] = to
		:: st[L(w, sx)] == INTX && failed[L(w, sx)] -> st[L(w, sx)] = READY
		:: else -> skip
		fi
	}
}

proctype Worker(byte w) {
	byte ntx = 0;
	byte x;
	bool ok;
	byte ax, bx, cx, co, fx, sx;    /* the inlines' loop variables */
end_idle:
	do
	:: claimOpt(0)
	:: claimOpt(1)
	:: atomic {
		/* BEGIN: the transaction takes the ready batches of one lane or of
		   both (a lane does not wait for the other past the linger) */
		txSt[w] == NOTX && ntx < MAXTX && (READYLANE(w, 0) || READYLANE(w, 1)) ->
		ntx++; txSt[w] = OPEN;
		if
		:: READYLANE(w, 0) -> st[L(w, 0)] = INTX
		:: READYLANE(w, 1) -> st[L(w, 1)] = INTX
		:: READYLANE(w, 0) && READYLANE(w, 1) -> st[L(w, 0)] = INTX; st[L(w, 1)] = INTX
		fi;
		printf("worker %d: begins a transaction with lanes %d %d\n", w, st[L(w, 0)] == INTX, st[L(w, 1)] == INTX)
	   }
	:: handleOpt(0)
	:: handleOpt(1)
	:: atomic {
		/* every handler failed: nothing to fence; roll back, go again */
		txSt[w] == OPEN && !fenced[w] && !INFENCE(w, 0) && !INFENCE(w, 1) ->
		txSt[w] = ABORTED; abort(w); settle(w, READY); forget(w)
	   }
	:: atomic {
		/* the fence statement, over every lane in the transaction */
		txSt[w] == OPEN && !fenced[w] && (INFENCE(w, 0) || INFENCE(w, 1)) &&
		(!INFENCE(w, 0) || wrote[L(w, 0)] || failed[L(w, 0)]) &&
		(!INFENCE(w, 1) || wrote[L(w, 1)] || failed[L(w, 1)]) &&
		FREE(w, 0) && FREE(w, 1) ->
		ok = (!INFENCE(w, 0) || PASSES(w, 0)) && (!INFENCE(w, 1) || PASSES(w, 1));
#ifdef PERROW
		/* row by row: what passes moves, what does not is refused, and the
		   statement does not fail */
		for (x : 0 .. NP - 1) {
			if
			:: INFENCE(w, x) && PASSES(w, x) -> LOCKROW(w, x); moved[L(w, x)] = true
			:: INFENCE(w, x) && !PASSES(w, x) -> st[L(w, x)] = REFUSED;
				printf("postgres: worker %d's fence statement refuses partition %d (claim %d), moves the others\n", w, x, claim[L(w, x)])
			:: else -> skip
			fi
		};
		fenced[w] = true
#else
		if
		:: ok ->
			for (x : 0 .. NP - 1) {
				if
				:: INFENCE(w, x) -> LOCKROW(w, x); moved[L(w, x)] = true
				:: else -> skip
				fi
			};
			fenced[w] = true;
			printf("postgres: worker %d's fence statement passes\n", w)
		:: else ->
			/* it fails, and so does the transaction: nothing of it becomes
			   visible; the refused lanes stop, the others go again */
			printf("postgres: worker %d's fence statement refuses: the transaction rolls back\n", w);
			for (x : 0 .. NP - 1) {
				if
				:: INFENCE(w, x) && !PASSES(w, x) -> st[L(w, x)] = REFUSED
				:: else -> skip
				fi
			};
			txSt[w] = ABORTED; abort(w); settle(w, READY); forget(w)
		fi
#endif
	   }
	:: atomic {
		/* COMMIT: its answer comes, or is lost (the COMMIT arrived, or it
		   never did and the session sits idle in the transaction) */
		txSt[w] == OPEN && fenced[w] && !sent[w] ->
		if
		:: apply(w); txSt[w] = COMMITTED;
			for (x : 0 .. NP - 1) {
				if
				:: st[L(w, x)] == INTX && !failed[L(w, x)] -> pos[L(w, x)]++
				:: else -> skip
				fi
			};
			settle(w, READY); forget(w)
		:: losses < MAXLOSS -> losses++; sent[w] = true; txSt[w] = COMMITTING; settle(w, RESOLVING);
			printf("worker %d: COMMIT sent, its answer lost\n", w)
		:: losses < MAXLOSS -> losses++; sent[w] = true; settle(w, RESOLVING);
			printf("worker %d: COMMIT lost before it arrived, answer lost\n", w)
		fi
	   }
	:: atomic {
		/* the session was ended from outside: the worker's next statement
		   fails; before its fence statement nothing can have committed
		   (go again), after it the outcome is resolved */
		txSt[w] == ABORTED && !sent[w] ->
		if
		:: fenced[w] -> settle(w, RESOLVING); sent[w] = true
		:: else -> settle(w, READY); forget(w)
		fi
	   }
	:: resolveOpt(0)
	:: resolveOpt(1)
	od
}

/* The server's side: a COMMIT that arrived is applied at any later moment;
   a session is ended from outside at any moment its transaction is open. */
inline serverOpt(w) {
	atomic {
		txSt[w] == COMMITTING -> apply(w); txSt[w] = COMMITTED
	}
}
inline endOpt(w) {
	atomic {
		txSt[w] == OPEN && ends < MAXEND -> ends++; txSt[w] = ABORTED; abort(w);
		printf("postgres: worker %d's session is ended (its transaction rolls back)\n", w)
	}
}

active proctype Server() {
	byte ax, bx, cx, co;            /* the inlines' loop variables */
end_server:
	do
	:: serverOpt(0)
	:: serverOpt(1)
	:: endOpt(0)
	:: endOpt(1)
	od
}

active proctype Coordinator() {
	byte x;
	atomic {
		asgN[0] = 1; asgN[1] = 1; asgOf[L(0, 0)] = 1; asgOf[L(0, 1)] = 1;
		run Worker(0); run Worker(1)
	}
	do
	:: moves < MAXMOVE ->
		atomic {
			select(x : 0 .. NP - 1);
			moves++; asgN[x]++; holder[x] = 1 - holder[x]; asgOf[L(holder[x], x)] = asgN[x];
			printf("coordinator: partition %d to worker %d (assignment %d)\n", x, holder[x], asgN[x])
		}
	:: break
	od
}

/* END: once nothing can move, no transaction is open and no row is locked. */
active proctype Final() {
	timeout ->
	assert(txSt[0] == NOTX && txSt[1] == NOTX && lock[0] == 0 && lock[1] == 0)
}
