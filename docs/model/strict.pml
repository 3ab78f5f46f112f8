/*
 * tenure's strict hand-off ("G3-strict"), model-checked with spin.
 *
 * One partition p of one consumer group. A strict lane ends each batch's
 * transaction with PREPARE TRANSACTION, commits the batch's offset to the
 * group coordinator with a raw OffsetCommit carrying the member id and the
 * generation (classic) or member epoch (KIP-848) of the lane's OWN
 * assignment, and only if the coordinator accepts does it COMMIT PREPARED.
 * A rejection means ROLLBACK PREPARED, or, where the lane's own assignment
 * is known (to its client) to be kept at a newer generation / epoch
 * (cooperative rebalances keep partitions; KIP-848 bumps a member's epoch
 * for changes elsewhere), a retry at that one. The lane sends one request
 * at a time and never rolls back while one is unanswered. A prepared batch
 * holds the fencing row's lock: the next claim of p waits on it, lists p's
 * prepared transactions and resolves each batch of an OLDER assignment than
 * its own by the group's committed offset, read after its own assignment
 * (the default decides by "offset at or past the batch's end", -DEXACT by
 * "the offset's metadata names the batch"); a batch of a newer assignment
 * it leaves alone (its claim is a zombie's). The offset mirror is off.
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
 * - a lost answer to an OffsetCommit is a crash of the lane's worker (the
 *   lane sends one request at a time and never rolls back on an unknown
 *   outcome);
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
 *   -DEXACT      a resolver commits a batch only if the committed offset's
 *                metadata names it (default: offset at or past its end)
 *   -DFOREIGN    someone else commits p's offset on an empty group (an
 *                operator's offset reset, a plain consumer)
 *   -DEXPIRE     p's committed offset expires while nobody holds p
 *   -DPOSTCHECK  (KIP-848) after an acceptance the lane commits only if its
 *                assignment was not revoked (its client's own knowledge)
 *   -DPRESUME    resolvers roll back every prepared batch (presumed abort;
 *                the committed offsets are no decision record)
 *   -DNOR        no assertions of G3-record (below)
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
 *   -DNORESOLVE  a new owner only waits for the prepared batch's lock
 *
 * Properties:
 *   G3-strict  at every COMMIT PREPARED: the coordinator accepted the
 *              batch's own offset commit while the batch's assignment was
 *              p's current assignment (ghost: okAcc, set at acceptance);
 *   G3-record  the committed offsets are the decision record: a batch is
 *              never rolled back after its offset commit was accepted,
 *              unless the record was lost since (group deleted, offset
 *              expired), and never accepted after it was rolled back;
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
#define NA 12           /* room for assignments */
#define NOV 255         /* no committed offset */

#define PREP 1
#define COMMITTED 2
#define ROLLEDBACK 3
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
byte wipes;             /* times the committed offsets were lost */

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
/* ghosts */
bool acc[MAXB + 1];     /* its offset commit was accepted ... */
bool okAcc[MAXB + 1];   /* ... while its assignment was current */
byte accWipe[MAXB + 1]; /* wipes at the acceptance */

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

/* classic (Kafka and kfake alike): the member must be in the group
   (UNKNOWN_MEMBER_ID), the generation the current one (ILLEGAL_GENERATION),
   the group not in CompletingRebalance (REBALANCE_IN_PROGRESS); no
   per-partition check. */
#define CLASSIC_OK(b) (rqMid[b] == cmid[rqW[b]] && rqGen[b] == gen && !completing)

/* KIP-848: the member must be in the group; an epoch above the member's is
   STALE_MEMBER_EPOCH; the member's own epoch commits any partition; an
   older one: */
#define HOLDS(m, id) (curAsg != 0 && asgW[curAsg] == m && asgMid[curAsg] == id)
#if defined(KIP1251)
/* Kafka 4.3 (KIP-1251): assignmentEpoch(p) <= clientEpoch <= brokerEpoch */
#define OLDER_OK(b) (HOLDS(rqW[b], rqMid[b]) && asgGen[curAsg] <= rqGen[b])
#elif defined(KFAKE)
/* kfake: STALE only if the member holds p at an assignment epoch above the
   request's; a partition it does not hold is accepted */
#define OLDER_OK(b) (!(HOLDS(rqW[b], rqMid[b]) && asgGen[curAsg] > rqGen[b]))
#else
/* Kafka <= 4.2: the epoch must equal the member's */
#define OLDER_OK(b) false
#endif
#define KIP_OK(b) (rqMid[b] == cmid[rqW[b]] && (rqGen[b] == mep[rqW[b]] || (rqGen[b] < mep[rqW[b]] && OLDER_OK(b))))

#ifdef KIP
#define COMMIT_OK(b) KIP_OK(b)
#else
#define COMMIT_OK(b) CLASSIC_OK(b)
#endif

#ifdef NOR
#define RECORD_ASSERT(x) skip
#else
#define RECORD_ASSERT(x) assert(x)
#endif

/* The coordinator processes batch b's offset commit. */
inline deliver(b) {
	atomic {
		if
		:: COMMIT_OK(b) ->
			printf("coordinator: offset commit of batch %d (p -> %d) at worker %d member %d epoch %d: accepted (its assignment %d, current %d)\n",
				b, bto[b], rqW[b], rqMid[b], rqGen[b], basg[b], curAsg);
			RECORD_ASSERT(bst[b] != ROLLEDBACK);   /* G3-record */
			oval = bto[b]; ometa = b;
			acc[b] = true; okAcc[b] = (curAsg == basg[b]); accWipe[b] = wipes;
			if :: pinc[rqW[b]] == rqInc[b] -> ans[b] = ACC :: else -> skip fi  /* a dead sender gets nothing */
		:: else ->
			printf("coordinator: offset commit of batch %d at worker %d member %d epoch %d: rejected\n", b, rqW[b], rqMid[b], rqGen[b]);
			if :: pinc[rqW[b]] == rqInc[b] -> ans[b] = REJ :: else -> skip fi
		fi;
		rq[b] = false; rqW[b] = 0; rqInc[b] = 0; rqMid[b] = 0; rqGen[b] = 0
	}
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
		/* the handler's transaction, the fence, PREPARE TRANSACTION */
		if
		CRASH
		DEAD
		:: atomic { ALIVE ->
			if
			:: rAsg == a && lockB == 0 && next == from ->
				nb++; b = nb; bst[b] = PREP; basg[b] = a; bto[b] = from + 1; lockB = b;
				printf("postgres: batch %d [%d,%d) of assignment %d prepared\n", b, from, bto[b], a)
			:: else ->
				printf("postgres: fence rejects worker %d (assignment %d)\n", w, a); goto done
			fi;
			k++; tries = 0; g = FIRSTGEN }
		fi;
send:
		/* the raw OffsetCommit */
		if
		CRASH
		DEAD
		:: atomic { ALIVE -> rq[b] = true; rqW[b] = w; rqInc[b] = inc; rqMid[b] = REQMID; rqGen[b] = g;
			printf("worker %d (assignment %d): sends offset commit of batch %d at member %d epoch %d\n", w, a, b, REQMID, g) }
		fi;
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
			:: tries < MAXRETRY && RETRYGEN > g ->
				/* the lane's assignment was kept at a newer generation */
				tries++; g = RETRYGEN;
				printf("worker %d (assignment %d): retries at epoch %d\n", w, a, g)
			:: else ->
				if
				:: bst[b] == PREP -> printf("postgres: ROLLBACK PREPARED batch %d (by its lane)\n", b); rollback_prepared(b)
				:: else -> skip
				fi;
				goto done
			fi };
			goto send
		fi
	:: else -> break
	od;
done:
	/* forget everything, so that the ended lane's states merge */
	skip;
	d_step { a = 0; inc = 0; w = 0; b = 0; from = 0; g = 0; k = 0; dv = 0; dm = 0; tries = 0 }
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
	:: rq[1] -> deliver(1)
	:: rq[2] -> deliver(2)
#if MAXB > 2
	:: rq[3] -> deliver(3)
#endif
#if MAXB > 3
	:: rq[4] -> deliver(4)
#endif
	od
}

/* END: once nothing can move, no prepared batch is left. */
active proctype Final() {
	timeout -> assert(lockB == 0)
}
