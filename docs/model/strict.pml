/*
 * tenure's strict hand-off ("G3-strict"), model-checked with spin.
 *
 * One partition p of one consumer group. A strict lane ends each batch's
 * transaction with PREPARE TRANSACTION, commits the batch's offset to the
 * group coordinator with a raw OffsetCommit carrying the member id and the
 * generation (classic) or member epoch (KIP-848) of the lane's OWN
 * assignment, and only if the coordinator accepts does it COMMIT PREPARED.
 * On a rejection, where the lane's own assignment is known (to its client)
 * to be kept at a newer generation / epoch (cooperative rebalances keep
 * partitions; KIP-848 bumps a member's epoch for changes elsewhere), it
 * retries at that one; otherwise it decides by the record: it reads the
 * group's committed offset and commits iff it names the batch, else ROLLBACK
 * PREPARED (the answer it sees may be a resent copy's, refused after an
 * earlier copy was accepted). The lane sends one request at a time, sends
 * it again while its answer is unknown, and never decides on an unknown
 * answer. A prepared batch holds the fencing row's lock: the next claim of
 * p waits on it, lists p's prepared transactions and resolves each batch of
 * an OLDER assignment than its own by the group's committed offset, read
 * after its own assignment; a batch of a newer assignment it leaves alone
 * (its claim is a zombie's). A decision by the record is "offset at or past
 * the batch's end" by default, "the offset's metadata names the batch and
 * the offset is its end" with -DEXACT (what consumer/strict.go does). The
 * offset mirror is off.
 *
 * Processes: the Coordinator (the group coordinator, its committed offset
 * of p, and the network: a request sent is processed at any later moment,
 * even after its sender crashed), one Lane per assignment of p (run by the
 * coordinator when it assigns p; a lane keeps running after its assignment
 * ended, until its worker process crashes or it is done: a zombie), and
 * Final (the end-state check). Postgres is the fencing row (claimant,
 * next offset), its lock, and the prepared batches. Every step of a lane is
 * one atomic action, and before every step its worker process may crash.
 *
 * Abstractions (runs and bounds: scripts/model-check-strict.sh):
 * - the claim protocol (register, confirm, bump, claim) is the claim
 *   statement alone, accepting a claim of any assignment not older than the
 *   row's claimant: what docs/model/ownership.pml proves of the real
 *   protocol (P1), and more (no confirmation is needed here). Tokens are
 *   assignment numbers, in coordinator order, across group lifetimes;
 * - a batch is one offset; "offset o" means "the job at o";
 * - lost answers (MAXLOSS in all): (a) an offset commit's connection breaks
 *   after the request was sent, and the client library sends the identical
 *   request again: the lane waits for the new copy's answer and does not
 *   know of the first; (b) no answer in time, and the lane sends the
 *   identical request again; (c) PREPARE TRANSACTION's answer is lost, and
 *   the batch is prepared or not: the lane looks (fence.Store.ResolvePrepare,
 *   once the session is gone, so the PREPARE cannot happen later) and goes
 *   on with the offset commit if prepared, runs the batch again where the
 *   fence allows if not. A copy nobody waits for any more (a, b, or a
 *   crashed sender's) is processed at any later moment, in any order with
 *   the others, its answer going nowhere; a crash also loses the answer;
 * - an accepted offset commit is in the record at once (the reads ask for
 *   stable offsets: Kafka answers them once no commit of the partition is
 *   pending);
 * - a crashed worker restarts at once; the coordinator replaces its member
 *   (a new member id) at its next rebalance (classic) or at the member's
 *   session timeout (KIP-848);
 * - a group deletion (or an empty group's expiry) empties the group at
 *   once: every member is removed, the committed offsets are gone, epochs
 *   restart; lanes of live workers go on as zombies and their processes
 *   join the next lifetime as new members;
 * - classic: PreparingRebalance is not a state of its own (the old
 *   generation stays current until the joins complete, as in Stable); a
 *   live member is never evicted (its lanes' commits would be rejected
 *   UNKNOWN_MEMBER_ID, which the generation check already gives);
 * - KIP-848: a revocation is one step (the client revokes, acknowledges,
 *   the coordinator moves the member to a new epoch without p); a live
 *   member fenced and rejoining with its id is the same step for the
 *   coordinator; p is assigned at the current group epoch. kfake's rejoin
 *   that keeps a member's epoch and assignment in place is not modeled.
 *
 * Builds:
 *   default      classic group protocol (generations, CompletingRebalance,
 *                cooperative: p kept across generations, or moved)
 *   -DKIP        KIP-848 (member epochs, p kept across epoch bumps, revoked,
 *                assigned at the current group epoch), with the offset
 *                commit rule of:
 *                  (default)   Kafka <= 4.2: epoch == member epoch
 *                  -DKIP1251   Kafka 4.3: equal, or older with p assigned to
 *                              the member at assignment epoch <= it
 *                  -DKFAKE     kfake: equal, or older unless the member now
 *                              holds p at an assignment epoch above it
 *   -DEXACT      a resolver, or a lane deciding by the record, commits a
 *                batch only if the committed offset's metadata names it
 *                (default: offset at or past its end)
 *   -DFOREIGN    someone else commits p's offset on an empty group (an
 *                operator's offset reset, a plain consumer)
 *   -DEXPIRE     p's committed offset expires while nobody holds p
 *   -DPOSTCHECK  (KIP-848) after an acceptance the lane commits only if its
 *                assignment was not revoked (its client's own knowledge)
 *   -DPRESUME    resolvers roll back every prepared batch (presumed abort;
 *                the committed offsets are no decision record)
 *   -DNOR        no assertions of G3-record (below)
 *   -DMAXLOSS=n  lost answers in all (default 1; 0: a crash is the only loss)
 * Variants that must FAIL (a load-bearing step taken out):
 *   -DCURGEN     the lane commits at its client's CURRENT member id and
 *                generation / member epoch, not its own assignment's
 *   -DCURMEMBER  the lane's own generation, but the client's current member
 *                id (classic; fails across group lifetimes)
 *   -DEARLYREAD  a resolver decides by a committed offset read before its
 *                own assignment
 *   -DNOOLDER    a resolver also resolves batches of newer assignments (a
 *                zombie resolving its successor's batch)
 *   -DMEMBERVOUCH  a lane retries at the generation / epoch at which its
 *                member holds p, whichever lane of the member holds it
 *   -DMIRROR     the offset mirror (consumer/mirror.go) runs beside strict
 *                lanes
 *   -DSAMEIDS    (KIP-848) a member keeps its member id into the next group
 *                lifetime
 *   -DTIMEOUTROLLBACK  a lane whose answer is late rolls back (its request
 *                still in flight)
 *   -DLOSTONLY   the rule before: a rejection rolls back unless an earlier
 *                answer of the batch was lost (and known lost: the client's
 *                own resend hides its loss)
 *   -DPREPGUESS  a lane whose PREPARE's answer was lost takes the batch as
 *                prepared
 *   -DNORESOLVE  a new owner only waits for the prepared batch's lock
 *
 * Properties:
 *   G3-strict  at every COMMIT PREPARED: the coordinator accepted the
 *              batch's own offset commit while the batch's assignment was
 *              p's current assignment (ghost: okAcc, set at acceptance);
 *   G3-record  the committed offsets are the decision record: a batch is
 *              never rolled back after its offset commit was accepted,
 *              unless the record was lost since (group deleted, offset
 *              expired, or moved back by a late copy of an earlier batch's
 *              commit, which leaves the record behind Postgres), and the
 *              record never names a batch rolled back or never prepared
 *              (an offset commit of such a batch is never accepted): the
 *              record is never ahead of Postgres, which the divergence
 *              check would read as lost commits;
 *   G1         batches commit contiguously (next offset == batch start);
 *   END        in every end state (nothing can move: the coordinator has
 *              replaced crashed members and assigned p to a live one), no
 *              prepared batch is left (Final, on timeout).
 * Every loop is bounded, so every run ends: END at every end state is "every
 * prepared batch is eventually committed or rolled back" within the bounds.
 */

#ifndef NW
#define NW 2            /* worker processes */
#endif
#ifndef MAXGEN
#define MAXGEN 3        /* generations / group epochs in the first lifetime
                           (rebalances that replace a crashed holder, or give
                           p to a member after a deletion, may go beyond) */
#endif
#ifndef MAXGEN2
#define MAXGEN2 MAXGEN  /* the same in later lifetimes */
#endif
#ifndef MAXLIFE
#define MAXLIFE 2       /* group lifetimes */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1      /* worker crashes in all */
#endif
#ifndef MAXB
#define MAXB 3          /* batches prepared in all */
#endif
#ifndef MAXBL
#define MAXBL 1         /* batches per lane */
#endif
#ifndef MAXRETRY
#define MAXRETRY 1      /* retries at a newer generation per batch */
#endif
#ifndef MAXLOSS
#define MAXLOSS 1       /* answers lost in all: an offset commit's connection
                           broken (the client resends), an offset commit
                           with no answer in time (the lane resends), a
                           PREPARE TRANSACTION's answer lost */
#endif
#if MAXLOSS > 1
#define NOS MAXLOSS     /* room per batch for copies nobody waits for */
#else
#define NOS 1
#endif
#define NA 12           /* room for assignments */
#define NOV 255         /* no committed offset */

#define PREP 1
#define COMMITTED 2
#define ROLLEDBACK 3
#define NOTPREP 4       /* PREPARE TRANSACTION's answer was lost: it did not
                           happen */
#define ACC 1
#define REJ 2

/* ---- the group coordinator ---- */
byte life = 1;          /* group lifetime */
byte gen = 0;           /* classic: generation; KIP-848: group epoch */
bool completing;        /* classic: CompletingRebalance (joined, not synced) */
bool grpEmpty;             /* the group has no members (after a deletion) */
byte cmid[NW];          /* per worker slot: the member id the coordinator has */
byte cgen[NW];          /* classic: the generation the client last learned
                           (kgo stores it from the JoinGroup response) */
byte mep[NW];           /* KIP-848: member epoch */
byte curAsg;            /* p's current assignment (0: none) */
byte nasg;              /* assignments so far; assignment a: */
byte asgW[NA];          /*   its worker */
byte asgMid[NA];        /*   its member id */
byte asgGen[NA];        /*   its generation / assignment epoch */
byte thr[NA];           /*   newest generation / epoch at which its client
                             saw it kept (lane.through) */
bool revoked[NA];       /*   its client revoked it (KIP-848) */
byte oval = NOV;        /* p's committed offset ... */
byte ometa;             /* ... and its metadata (the batch it names; 0: none) */
byte wipes;             /* times the record was lost (deleted, expired,
                           moved back by a late copy) */

/* ---- worker processes ---- */
byte pinc[NW];          /* process incarnation: lanes of an older one are dead */
bool crashed[NW];       /* crashed, its member not replaced yet */
byte ncrash;

/* ---- Postgres ---- */
byte rAsg;              /* the fencing row's claimant (its assignment) */
byte next;              /* p's next offset */
byte lockB;             /* the prepared batch holding the row's lock (0: none) */

/* ---- batches (prepared transactions) and their offset commits ---- */
byte nb;
byte bst[MAXB + 1];     /* PREP, COMMITTED, ROLLEDBACK */
byte basg[MAXB + 1];    /* its assignment */
byte bto[MAXB + 1];     /* its end (the offset it commits) */
bool rq[MAXB + 1];      /* its offset commit is in flight ... */
byte rqW[MAXB + 1];     /* ... from worker slot ... */
byte rqInc[MAXB + 1];   /* ... process incarnation ... */
byte rqMid[MAXB + 1];   /* ... member id ... */
byte rqGen[MAXB + 1];   /* ... at generation / member epoch */
byte ans[MAXB + 1];     /* the answer waiting for its lane */
bool oq[(MAXB + 1) * NOS];   /* copies in flight nobody waits for (slot i is */
byte oMid[(MAXB + 1) * NOS]; /* batch i / NOS's): member id ... */
byte oGen[(MAXB + 1) * NOS]; /* ... and generation / member epoch */
byte losses;            /* answers lost so far */
/* ghosts */
bool acc[MAXB + 1];     /* its offset commit was accepted ... */
bool okAcc[MAXB + 1];   /* ... once while its assignment was current */
byte accWipe[MAXB + 1]; /* wipes at the (last) acceptance */

#ifdef EARLYREAD
bool wrd[NW];           /* the worker read p's committed offset before its
                           next assignment ... */
byte wov[NW];
byte wom[NW];
byte asgOv[NA];         /* ... which its resolver then uses */
byte asgOm[NA];
#endif
#ifdef MIRROR
bool mirrored;
#endif
#ifdef FOREIGN
bool foreign;
#endif
#ifdef EXPIRE
bool expired;
#endif

/* ---- the offset commit: the coordinator's acceptance rules ---- */

/* A copy of an offset commit from worker slot w, member id m, generation /
   member epoch g. */

/* classic (Kafka and kfake alike): the member must be in the group
   (UNKNOWN_MEMBER_ID), the generation the current one (ILLEGAL_GENERATION),
   the group not in CompletingRebalance (REBALANCE_IN_PROGRESS); no
   per-partition check. */
#define CLASSIC_OK(w, m, g) (m == cmid[w] && g == gen && !completing)

/* KIP-848: the member must be in the group; an epoch above the member's is
   STALE_MEMBER_EPOCH; the member's own epoch commits any partition; an
   older one: */
#define HOLDS(x, id) (curAsg != 0 && asgW[curAsg] == x && asgMid[curAsg] == id)
#if defined(KIP1251)
/* Kafka 4.3 (KIP-1251): assignmentEpoch(p) <= clientEpoch <= brokerEpoch */
#define OLDER_OK(w, m, g) (HOLDS(w, m) && asgGen[curAsg] <= g)
#elif defined(KFAKE)
/* kfake: STALE only if the member holds p at an assignment epoch above the
   request's; a partition it does not hold is accepted */
#define OLDER_OK(w, m, g) (!(HOLDS(w, m) && asgGen[curAsg] > g))
#else
/* Kafka <= 4.2: the epoch must equal the member's */
#define OLDER_OK(w, m, g) false
#endif
#define KIP_OK(w, m, g) (m == cmid[w] && (g == mep[w] || (g < mep[w] && OLDER_OK(w, m, g))))

#ifdef KIP
#define COMMIT_OK(w, m, g) KIP_OK(w, m, g)
#else
#define COMMIT_OK(w, m, g) CLASSIC_OK(w, m, g)
#endif

#ifdef NOR
#define RECORD_ASSERT(x) skip
#else
#define RECORD_ASSERT(x) assert(x)
#endif

/* The coordinator accepts a copy of batch b's offset commit: the record
   names b. */
inline accept(b) {
	/* G3-record: never a batch rolled back, or never prepared */
	RECORD_ASSERT(bst[b] == PREP || bst[b] == COMMITTED);
	if
	:: ometa > b ->
		/* a late copy of an earlier batch's commit moves the record back:
		   the later batch's record is lost (that batch is decided, or
		   its lane decides it by the record) */
		wipes++
	:: else -> skip
	fi;
	oval = bto[b]; ometa = b;
	acc[b] = true; okAcc[b] = okAcc[b] || curAsg == basg[b]; accWipe[b] = wipes
}

/* The coordinator processes the copy of batch b's offset commit whose
   answer its lane waits for. */
inline deliver(b) {
	atomic {
		if
		:: COMMIT_OK(rqW[b], rqMid[b], rqGen[b]) ->
			printf("coordinator: offset commit of batch %d (p -> %d) at worker %d member %d epoch %d: accepted (its assignment %d, current %d)\n",
				b, bto[b], rqW[b], rqMid[b], rqGen[b], basg[b], curAsg);
			accept(b);
			if :: pinc[rqW[b]] == rqInc[b] -> ans[b] = ACC :: else -> skip fi  /* a dead sender gets nothing */
		:: else ->
			printf("coordinator: offset commit of batch %d at worker %d member %d epoch %d: rejected\n", b, rqW[b], rqMid[b], rqGen[b]);
			if :: pinc[rqW[b]] == rqInc[b] -> ans[b] = REJ :: else -> skip fi
		fi;
		rq[b] = false; rqW[b] = 0; rqInc[b] = 0; rqMid[b] = 0; rqGen[b] = 0
	}
}

/* The coordinator processes copy i (a slot of batch i / NOS) that nobody
   waits for any more: its answer goes nowhere. */
inline deliver_orphan(i) {
	atomic {
		if
		:: COMMIT_OK(asgW[basg[(i) / NOS]], oMid[(i)], oGen[(i)]) ->
			printf("coordinator: a late copy of batch %d's offset commit (p -> %d) at member %d epoch %d: accepted (its assignment %d, current %d)\n",
				(i) / NOS, bto[(i) / NOS], oMid[(i)], oGen[(i)], basg[(i) / NOS], curAsg);
			accept((i) / NOS)
		:: else ->
			printf("coordinator: a late copy of batch %d's offset commit at member %d epoch %d: rejected\n", (i) / NOS, oMid[(i)], oGen[(i)])
		fi;
		oq[(i)] = false; oMid[(i)] = 0; oGen[(i)] = 0
	}
}

/* Batch b's copy in flight, or its answer, is no longer waited for: the
   copy goes on as an orphan (processed at any later moment), the answer is
   lost. */
inline orphan(b) {
	if
	:: rq[b] ->
		if
		:: !oq[b * NOS] -> oq[b * NOS] = true; oMid[b * NOS] = rqMid[b]; oGen[b * NOS] = rqGen[b]
#if NOS > 1
		:: oq[b * NOS] -> assert(!oq[b * NOS + 1]);
			oq[b * NOS + 1] = true; oMid[b * NOS + 1] = rqMid[b]; oGen[b * NOS + 1] = rqGen[b]
#endif
		fi;
		rq[b] = false; rqW[b] = 0; rqInc[b] = 0; rqMid[b] = 0; rqGen[b] = 0
	:: else -> ans[b] = 0
	fi
}

/* ---- Postgres: COMMIT PREPARED and ROLLBACK PREPARED ---- */

inline commit_prepared(b) {
	assert(okAcc[b]);               /* G3-strict */
	assert(next + 1 == bto[b]);     /* G1 */
	bst[b] = COMMITTED; next = bto[b]; lockB = 0
}

inline rollback_prepared(b) {
	RECORD_ASSERT(!acc[b] || accWipe[b] != wipes);   /* G3-record */
	bst[b] = ROLLEDBACK; lockB = 0
}

/* ---- a lane ---- */

#define ALIVE (pinc[w] == inc)
#define DEAD :: atomic { !ALIVE -> goto done }
/* its worker process crashes before the step */
#define CRASH :: atomic { ALIVE && ncrash < MAXCRASH -> ncrash++; pinc[w]++; crashed[w] = true; printf("worker %d: crashes (lane of assignment %d)\n", w, a); goto done }

/* What the lane's offset commit carries. */
#if defined(CURGEN)
/* the client's current member id and generation / member epoch */
#define REQMID cmid[w]
#ifdef KIP
#define CURG mep[w]
#else
#define CURG cgen[w]
#endif
#define FIRSTGEN CURG
#else
#define REQMID asgMid[a]
#ifdef CURMEMBER
#undef REQMID
#define REQMID cmid[w]
#endif
#define FIRSTGEN asgGen[a]
#endif

/* Where a rejected lane may retry. */
#if defined(CURGEN)
#define RETRYGEN CURG
#elif defined(MEMBERVOUCH)
/* vouched for by the member: it holds p (any of its assignments) */
#ifdef KIP
#define RETRYGEN (HOLDS(w, asgMid[a]) -> mep[w] : 0)
#else
#define RETRYGEN ((HOLDS(w, asgMid[a]) && !completing) -> gen : 0)
#endif
#else
/* the lane's own assignment, known kept at a newer generation / epoch */
#define RETRYGEN thr[a]
#endif
#define CANRETRY (tries < MAXRETRY && RETRYGEN > g)

/* What a resolver decides by. */
#ifdef EARLYREAD
#define RESOLVE_READ dv = asgOv[a]; dm = asgOm[a]
#else
#define RESOLVE_READ dv = oval; dm = ometa
#endif
#if defined(PRESUME)
#define DECIDE_COMMIT(b) false
#elif defined(EXACT)
#define DECIDE_COMMIT(b) (dm == b && dv == bto[b])
#else
#define DECIDE_COMMIT(b) (dv != NOV && dv >= bto[b])
#endif
#if defined(NORESOLVE)
#define RESOLVABLE(b) false
#elif defined(NOOLDER)
#define RESOLVABLE(b) (basg[b] != a)
#else
#define RESOLVABLE(b) (basg[b] < a)
#endif

proctype Lane(byte a; byte inc) {
	byte w = asgW[a];
	byte b, from, g, k, dv, dm, tries;
	bool plost;             /* PREPARE's answer was lost */
#ifdef LOSTONLY
	bool unk;               /* an earlier answer of the batch was lost */
#endif

claim:
	/* the claim statement: it waits on a prepared batch's lock; meanwhile
	   the lane lists p's prepared transactions, reads the group's committed
	   offset of p (its own assignment came before) and resolves each */
	if
	CRASH
	DEAD
	:: atomic { ALIVE && lockB == 0 ->
		if
		:: a >= rAsg -> rAsg = a; from = next;
			printf("postgres: claim by worker %d (assignment %d) accepted, next offset %d\n", w, a, next)
		:: else ->
			printf("postgres: claim by worker %d (assignment %d) rejected\n", w, a); goto done
		fi }
	:: atomic { ALIVE && lockB != 0 -> b = lockB;
		printf("worker %d (assignment %d): claim waits on prepared batch %d (assignment %d)\n", w, a, b, basg[b]);
		if
		:: RESOLVABLE(b) -> skip
		:: else -> printf("worker %d (assignment %d): does not resolve batch %d: gives up\n", w, a, b); goto done
		fi;
		RESOLVE_READ;
		printf("worker %d (assignment %d): reads committed offset %d (batch %d)\n", w, a, dv, dm) }
		if
		CRASH
		DEAD
		:: atomic { ALIVE ->
			if
			:: bst[b] == PREP && DECIDE_COMMIT(b) ->
				printf("postgres: COMMIT PREPARED batch %d (by worker %d, resolving)\n", b, w);
				commit_prepared(b)
			:: bst[b] == PREP && !DECIDE_COMMIT(b) ->
				printf("postgres: ROLLBACK PREPARED batch %d (by worker %d, resolving)\n", b, w);
				rollback_prepared(b)
			:: else -> skip
			fi;
			b = 0; dv = 0; dm = 0 }
		fi;
		goto claim
	fi;

	k = 0;
	do
	:: k < MAXBL && nb < MAXB ->
		/* the handler's transaction, the fence, PREPARE TRANSACTION (its
		   answer may be lost: the lane then does not know whether the
		   batch is prepared) */
		if
		CRASH
		DEAD
		:: atomic { ALIVE ->
			if
			:: rAsg == a && lockB == 0 && next == from ->
				nb++; b = nb; basg[b] = a; bto[b] = from + 1;
				if
				:: bst[b] = PREP; lockB = b;
					printf("postgres: batch %d [%d,%d) of assignment %d prepared\n", b, from, bto[b], a)
				:: losses < MAXLOSS -> losses++; plost = true;
					if
					:: bst[b] = PREP; lockB = b
					:: bst[b] = NOTPREP
					fi;
					printf("postgres: batch %d [%d,%d) of assignment %d: PREPARE's answer lost (prepared: %d)\n", b, from, bto[b], a, bst[b] == PREP)
				fi
			:: else ->
				printf("postgres: fence rejects worker %d (assignment %d)\n", w, a); goto done
			fi;
			k++; tries = 0; g = FIRSTGEN;
#ifdef LOSTONLY
			unk = false;
#endif
			skip }
		fi;
		if
		:: plost ->
			/* once the session is gone, the lane looks the batch up
			   (fence.Store.ResolvePrepare) */
			if
			CRASH
			DEAD
			:: atomic { ALIVE -> plost = false;
				if
				:: bst[b] == PREP -> printf("worker %d (assignment %d): batch %d is prepared\n", w, a, b)
#ifdef PREPGUESS
				:: else -> printf("worker %d (assignment %d): takes batch %d as prepared\n", w, a, b)
#else
				:: bst[b] == COMMITTED ->
					/* committed by a claim: the next batch */
					from = next; b = 0; g = 0; goto nextb
				:: bst[b] == NOTPREP || bst[b] == ROLLEDBACK ->
					/* not prepared (or rolled back by a claim since):
					   the batch again, where the fence allows it */
					printf("worker %d (assignment %d): batch %d is not prepared\n", w, a, b);
					b = 0; g = 0; k--; goto nextb
#endif
				fi }
			fi
		:: else -> skip
		fi;
send:
		/* the raw OffsetCommit */
		if
		CRASH
		DEAD
		:: atomic { ALIVE -> rq[b] = true; rqW[b] = w; rqInc[b] = inc; rqMid[b] = REQMID; rqGen[b] = g;
			printf("worker %d (assignment %d): sends offset commit of batch %d at member %d epoch %d\n", w, a, b, REQMID, g) }
		fi;
wait:
		/* its answer, and what the lane does on it (a crash before: the
		   answer is lost, the request may still be processed) */
		if
		CRASH
		DEAD
#ifdef TIMEOUTROLLBACK
		/* the answer is late: the lane rolls back while its request is
		   still in flight */
		:: atomic { ALIVE && rq[b] -> printf("postgres: ROLLBACK PREPARED batch %d (its lane timed out)\n", b);
			rollback_prepared(b); goto done }
#endif
		/* the connection breaks after the request was sent: the client
		   library sends the identical request again, and the answer the
		   lane gets is the new copy's; the first copy may still be
		   processed (or was, and its answer is lost) */
		:: atomic { ALIVE && losses < MAXLOSS && (rq[b] || ans[b] != 0) -> losses++;
			orphan(b);
			rq[b] = true; rqW[b] = w; rqInc[b] = inc; rqMid[b] = REQMID; rqGen[b] = g;
			printf("worker %d (assignment %d): connection broken; the client sends batch %d's offset commit again\n", w, a, b) }
			goto wait
		/* no answer in time: the lane sends the identical request again
		   (it never rolls back while an answer is unknown); the copy it
		   gave up on may still be processed, late */
		:: atomic { ALIVE && losses < MAXLOSS && (rq[b] || ans[b] != 0) -> losses++;
			orphan(b);
#ifdef LOSTONLY
			unk = true;
#endif
			printf("worker %d (assignment %d): no answer for batch %d's offset commit\n", w, a, b) }
			goto send
		:: atomic { ALIVE && ans[b] == ACC -> ans[b] = 0;
#ifdef POSTCHECK
			if
			:: revoked[a] ->
				/* accepted, but the assignment may have ended before */
				if
				:: bst[b] == PREP -> printf("postgres: ROLLBACK PREPARED batch %d (its lane was revoked)\n", b); rollback_prepared(b)
				:: else -> skip
				fi;
				goto done
			:: else -> skip
			fi;
#endif
			if
			:: bst[b] == PREP ->
				printf("postgres: COMMIT PREPARED batch %d (by its lane)\n", b);
				commit_prepared(b); from = next
			:: else ->
				/* a resolver got there first: the lane claims again */
				goto done
			fi;
			b = 0; g = 0; tries = 0 }
		:: atomic { ALIVE && ans[b] == REJ -> ans[b] = 0;
			if
			:: CANRETRY ->
				/* the lane's assignment was kept at a newer generation */
				tries++; g = RETRYGEN;
				printf("worker %d (assignment %d): retries at epoch %d\n", w, a, g);
				goto send
#ifdef LOSTONLY
			/* the rule before: roll back, unless an earlier answer was
			   lost */
			:: !CANRETRY && !unk ->
				if
				:: bst[b] == PREP -> printf("postgres: ROLLBACK PREPARED batch %d (by its lane)\n", b); rollback_prepared(b)
				:: else -> skip
				fi;
				goto done
			:: !CANRETRY && unk ->
#else
			:: else ->
#endif
				/* refused, and never accepted at that member and
				   generation again: whether a copy was accepted is in the
				   record, read now (a later read could only find the
				   record overwritten, as the decision below may) */
				dv = oval; dm = ometa;
				printf("worker %d (assignment %d): rejected; reads committed offset %d (batch %d)\n", w, a, dv, dm)
			fi }
			/* decide by the record */
			if
			CRASH
			DEAD
			:: atomic { ALIVE ->
				if
				:: bst[b] == PREP && DECIDE_COMMIT(b) ->
					printf("postgres: COMMIT PREPARED batch %d (by its lane, by the record)\n", b);
					commit_prepared(b); from = next
				:: bst[b] == PREP && !DECIDE_COMMIT(b) ->
					printf("postgres: ROLLBACK PREPARED batch %d (by its lane, by the record)\n", b);
					rollback_prepared(b); goto done
				:: else -> goto done
				fi;
				b = 0; g = 0; tries = 0; dv = 0; dm = 0 }
			fi
		fi;
nextb:
		skip
	:: else -> break
	od;
done:
	/* forget everything, so that the ended lane's states merge */
	skip;
	d_step { a = 0; inc = 0; w = 0; b = 0; from = 0; g = 0; k = 0; dv = 0; dm = 0; tries = 0; plost = false;
#ifdef LOSTONLY
		unk = false
#endif
	}
}

/* ---- the group coordinator ---- */

/* Assign p to worker slot x as a new assignment, and start its lane (a
   crashed process runs nothing: its member stays until it is replaced). */
inline assign(x, ep) {
	nasg++; assert(nasg < NA);
	asgW[nasg] = x; asgMid[nasg] = cmid[x]; asgGen[nasg] = ep; curAsg = nasg;
#ifdef EARLYREAD
	if
	:: wrd[x] -> asgOv[nasg] = wov[x]; asgOm[nasg] = wom[x]; wrd[x] = false; wov[x] = 0; wom[x] = 0
	:: else -> asgOv[nasg] = oval; asgOm[nasg] = ometa
	fi;
#endif
	printf("coordinator: assignment %d: p to worker %d (member %d, lifetime %d, epoch %d)\n", nasg, x, cmid[x], life, ep);
	if
	:: !crashed[x] -> run Lane(nasg, pinc[x])
	:: else -> skip
	fi
}

/* replace the member of a crashed worker process (a new member id) */
inline replace(x) {
	if
	:: crashed[x] -> cmid[x]++; crashed[x] = false;
		printf("coordinator: worker %d's crashed member replaced by member %d\n", x, cmid[x])
	:: else -> skip
	fi
}

inline delete_group() {
	life++; curAsg = 0; completing = false; grpEmpty = true;
	oval = NOV; ometa = 0; wipes++;
	i = 0;
	do
	:: i < NW ->
#if defined(KIP) && defined(SAMEIDS)
		if :: crashed[i] -> cmid[i]++ :: else -> skip fi;
#else
		cmid[i]++;
#endif
		crashed[i] = false; cgen[i] = 0; mep[i] = 1; i++
	:: else -> break
	od;
#ifdef KIP
	gen = 1;
#else
	gen = 0;
#endif
	printf("coordinator: group deleted (or expired): lifetime %d, committed offsets gone\n", life)
}

#define KREPAIR(x) :: atomic { crashed[x] -> \
		if \
		:: curAsg != 0 && asgW[curAsg] == x -> revoked[curAsg] = true; curAsg = 0 \
		:: else -> skip \
		fi; \
		replace(x); gen++; mep[x] = gen }

/* the copies of batch b nobody waits for */
#if NOS > 1
#define ORPHANS(b) :: atomic { oq[b * NOS] -> deliver_orphan((b * NOS)) } \
	:: atomic { oq[b * NOS + 1] -> deliver_orphan((b * NOS + 1)) }
#else
#define ORPHANS(b) :: atomic { oq[b] -> deliver_orphan(b) }
#endif

/* p's holder is gone: p must go to a live member (fair progress) */
#define GENMAX (life == 1 -> MAXGEN : MAXGEN2)
#define HOLDERGONE (curAsg == 0 || crashed[asgW[curAsg]] || asgMid[curAsg] != cmid[asgW[curAsg]])

active proctype Coordinator() {
	byte i, x;
	atomic {
		i = 0;
		do
		:: i < NW -> cmid[i] = 1; mep[i] = 1; i++
		:: else -> break
		od;
#ifdef KIP
		gen = 1
#endif
	}
end_coord:
	do
#ifndef KIP
	/* classic: a rebalance's joins complete: a new generation (the clients
	   learn it from the JoinGroup response); crashed members are replaced */
	:: atomic { !completing && (gen < GENMAX || HOLDERGONE) ->
		gen++; completing = true; grpEmpty = false;
		i = 0;
		do
		:: i < NW -> replace(i); cgen[i] = gen; i++
		:: else -> break
		od;
		printf("coordinator: generation %d joined (CompletingRebalance)\n", gen) }
	/* SyncGroup: p stays with its assignment (cooperative) ... */
	:: atomic { completing && curAsg != 0 && asgMid[curAsg] == cmid[asgW[curAsg]] ->
		completing = false; thr[curAsg] = gen;
		printf("coordinator: generation %d synced, p stays with assignment %d\n", gen, curAsg) }
	/* ... or goes to a member, as a new assignment */
	:: atomic { completing ->
		completing = false;
		x = 0; do :: x < NW - 1 -> x++ :: break od;
		assign(x, gen); x = 0 }
#else
	/* KIP-848: the holder's member epoch moves on, p kept (a change
	   elsewhere); its client sees p kept at the new epoch */
	:: atomic { gen < GENMAX && curAsg != 0 ->
		gen++; mep[asgW[curAsg]] = gen; thr[curAsg] = gen;
		printf("coordinator: epoch %d: worker %d keeps p (assignment %d)\n", gen, asgW[curAsg], curAsg) }
	/* p is revoked: the holder's client revokes it (its lane knows) and
	   acknowledges; the holder moves to a new epoch without p */
	:: atomic { gen < GENMAX && curAsg != 0 ->
		gen++; mep[asgW[curAsg]] = gen; revoked[curAsg] = true;
		printf("coordinator: epoch %d: p revoked from worker %d (assignment %d)\n", gen, asgW[curAsg], curAsg);
		curAsg = 0 }
	/* p, free, is assigned to a member at the current group epoch */
	:: atomic { curAsg == 0 ->
		x = 0; do :: x < NW - 1 -> x++ :: break od;
		mep[x] = gen; grpEmpty = false; assign(x, gen); x = 0 }
	/* a crashed worker's member times out; the restarted process joins as
	   a new member, at a new epoch */
	KREPAIR(0)
	KREPAIR(1)
#if NW > 2
	KREPAIR(2)
#endif
#endif
	/* the group is deleted (or expires): a new lifetime */
	:: atomic { life < MAXLIFE && !completing -> delete_group() }
#ifdef EXPIRE
	/* p's committed offset expires while nobody holds p */
	:: atomic { !expired && curAsg == 0 && oval != NOV ->
		expired = true; oval = NOV; ometa = 0; wipes++;
		printf("coordinator: p's committed offset expires\n") }
#endif
#ifdef FOREIGN
	/* on an empty group, someone else commits p's offset (generation -1) */
	:: atomic { !foreign && grpEmpty ->
		foreign = true; ometa = 0;
		if :: oval = 1 :: oval = 2 fi;
		printf("coordinator: someone else commits p's offset %d\n", oval) }
#endif
#ifdef MIRROR
	/* the holder's offset mirror commits Postgres's next offset, at its
	   member's current generation (accepted) */
	:: atomic { !mirrored && curAsg != 0 && rAsg == curAsg && !completing && !crashed[asgW[curAsg]] ->
		mirrored = true; oval = next; ometa = 0;
		printf("coordinator: the mirror of worker %d commits p's offset %d\n", asgW[curAsg], next) }
#endif
#ifdef EARLYREAD
	/* a worker reads p's committed offset (before its next assignment) */
	:: atomic { !wrd[0] -> wrd[0] = true; wov[0] = oval; wom[0] = ometa;
		printf("worker 0: reads committed offset %d (batch %d)\n", oval, ometa) }
	:: atomic { !wrd[NW - 1] -> wrd[NW - 1] = true; wov[NW - 1] = oval; wom[NW - 1] = ometa;
		printf("worker %d: reads committed offset %d (batch %d)\n", NW - 1, oval, ometa) }
#endif
	/* the network: an offset commit in flight arrives */
	:: atomic { rq[1] -> deliver(1) }
	:: atomic { rq[2] -> deliver(2) }
#if MAXB > 2
	:: atomic { rq[3] -> deliver(3) }
#endif
#if MAXB > 3
	:: atomic { rq[4] -> deliver(4) }
#endif
	/* ... or a copy nobody waits for, in any order */
	ORPHANS(1)
	ORPHANS(2)
#if MAXB > 2
	ORPHANS(3)
#endif
#if MAXB > 3
	ORPHANS(4)
#endif
	od
}

/* END: once nothing can move, no prepared batch is left. */
active proctype Final() {
	timeout -> assert(lockB == 0)
}
