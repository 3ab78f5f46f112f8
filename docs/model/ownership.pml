/*
 * tenure's ownership protocol, model-checked with spin.
 *
 * One partition p of one consumer group, NW worker processes, a group
 * coordinator that assigns p, moves it, and resets the group (deletion, or
 * expiry while empty: group epochs restart at 1), and the Postgres state:
 * the group's incarnation with its registered high epoch, and p's fencing
 * row. Every step of a worker is a separate atomic action, so spin explores
 * every interleaving: a pause, a slow network or a frozen process at any
 * step is one of them.
 *
 * Builds (see docs/fencing.md, "The model"):
 *   default        the protocol tenure runs, classic group protocol
 *   -DKIP          the same protocol, KIP-848 (per-member epochs: a describe
 *                  confirms, the token is the group epoch seen while holding p;
 *                  p can move without the group epoch moving)
 *   -DMAXRECOV=n   recovery attempts per lane (default 1; 0: no recovery)
 *   -DOLD          the protocol before registration (incarnation read once,
 *                  bumped only when a claim is rejected): must FAIL
 *   -DLATEREG      registration after the confirmation: must FAIL
 *   -DOWNERONLY    the claimant is the member, not the lane: must FAIL
 *   -DMEMBERCONFIRM  lane recovery as it was before the lane order: vouched
 *                  for by the member (classic: the heartbeat at the member's
 *                  generation alone, whoever holds p; KIP-848: the describe,
 *                  as in the fixed protocol), and no lane order in the claim
 *                  statement: must FAIL on both protocols
 *   -DMEMBERVOUCH  the first half of it alone: classic recovery vouched for
 *                  by the heartbeat alone, the lane order kept: must FAIL
 *   -DNOLANEORDER  the second half alone: no lane order in the claim
 *                  statement: must FAIL under KIP-848 (classic passes: its
 *                  recovery confirms the lane's own assignment)
 *   -DIDSDOWN      the lane order kept, but claim ids that do not grow with
 *                  a worker's lanes: must FAIL under KIP-848
 *   -DSTRICTP1     under KIP-848, P1 for a recovering lane's own assignment
 *                  (see MEMBERP1 below): FAILS; passes with -DLANEDESCRIBE
 *
 * Lane recovery: a lane whose claim did not get through (not confirmed, out
 * of rounds) or whose commit was rejected keeps running beside its worker's
 * later assignments (the Go code stops an old lane asynchronously) and
 * claims again, at most MAXRECOV times: it asks the coordinator first (a
 * waiting lane never registers), then claims in rounds (register, confirm,
 * bump, claim) with its own claimant at the epoch it was told, and commits.
 * Its confirmation, RCONFIRM: classic, the member's heartbeat at the
 * current generation G succeeds and the lane's own assignment is still the
 * member's assignment of p at G (a rebalance that leaves p where it is keeps
 * it so at the new generation); KIP-848, the describe shows the member
 * holding p, at the group epoch. Claim ids grow per worker process, and the
 * claim statement refuses, whatever the tokens, a claim by an older lane
 * (lower claim id) of the member (owner) that holds the row: the lane
 * order. A lane refused so is superseded and gives up.
 *
 * The property (assertions, checked at every accepted claim and commit):
 *   P1 (lifetimes and hand-offs) once the claim of a newer assignment of p
 *      (coordinator order; a newer group lifetime's assignments are newer)
 *      has been accepted, no claim or commit made for an older assignment
 *      is accepted, whatever the epoch values. A worker's claim is made for
 *      the assignment its confirmation vouched for; a recovering lane's,
 *      classic, for the lane's own assignment, whatever its confirmation
 *      saw; KIP-848, see MEMBERP1;
 *   P2 (G2) accepted tokens never go down;
 *   P3 (G1) commits advance the next offset from where it stood, once each.
 * Every lane's recovery ends: its loops are bounded, and pan reports any
 * process left outside an end state.
 */

#ifndef NW
#define NW 3
#endif
#ifndef MAXLIFE
#define MAXLIFE 2
#endif
#ifndef MAXGEN
#define MAXGEN 3
#endif
#ifndef MAXASG
#define MAXASG 4
#endif
#ifndef MAXROUNDS
#define MAXROUNDS 4
#endif
#ifndef MAXCOMMITS
#define MAXCOMMITS 1
#endif
#ifndef MAXRECOV
#define MAXRECOV 1      /* recovery attempts per lane */
#endif
#ifdef MEMBERCONFIRM
#define MEMBERVOUCH
#define NOLANEORDER
#endif
#define NONE 255

#define LESS(i1, e1, i2, e2) ((i1) < (i2) || ((i1) == (i2) && (e1) < (e2)))

/* ---- the group coordinator ---- */
byte life = 1;          /* group lifetime; a reset starts the next */
byte gen = 0;           /* group epoch within the lifetime (classic: generation) */
byte holder = NONE;     /* the worker p is assigned to */
byte holderAsg = 0;     /* that assignment's number, in coordinator order */
byte nasg = 0;          /* assignments so far */
byte asgSeq[NW];        /* per worker: its newest assignment of p ... */
byte asgLife[NW];       /* ... in which lifetime ... */
byte asgEp[NW];         /* ... at which epoch */
byte asgWorker[MAXASG + 1];  /* per assignment: its worker */

/* ---- Postgres ---- */
byte inc = 0;           /* the group's incarnation */
byte hw = 0;            /* highest epoch registered under inc */
bool row = false;       /* p's fencing row exists */
byte rInc = 0;
byte rEp = 0;
byte rClaim = 0;        /* the claimant: the lane's claim id, its assignment
                           number (unique per lane, growing per worker) */
byte rOwnW = 0;         /* the owner: the claimant's member, a worker ... */
byte rOwnL = 0;         /* ... in one lifetime (a member id per process) */
byte next = 0;          /* p's next offset */

/* ---- ghosts, for the assertions only ---- */
byte newest = 0;        /* newest assignment whose claim was accepted */
byte maxInc = 0;        /* highest token accepted so far */
byte maxEp = 0;

/*
 * Confirm with the coordinator. Classic: a heartbeat with the member's
 * generation succeeds only while that generation is current and the member
 * in the group; p is fixed per generation. KIP-848: a describe shows the
 * member holding p now, and the group epoch. A member is a worker in one
 * lifetime: a reset needs an empty group, and a removed member joins again
 * under a new member id (classic: the coordinator's; kgo's KIP-848 client: a
 * fresh UUID after UNKNOWN_MEMBER_ID). by is the assignment the confirmation
 * vouches for.
 */
#ifdef KIP
#define CONFIRM(w, l, v) ok = (holder == w && life == l); G = gen; by = holderAsg
#else
#define CONFIRM(w, l, v) ok = (holder == w && life == l && gen == v); G = gen; by = holderAsg
#endif

/*
 * The confirmation of a recovering lane a (of worker w, lifetime l) at epoch
 * v. Classic: the member's heartbeat at v succeeds and p's assignment at v
 * is still a (a rebalance that left p where it was keeps a current at the
 * new generation); -DMEMBERVOUCH: the heartbeat alone (any holder). KIP-848:
 * the describe, as for a claim: the member holds p (it cannot tell a from a
 * newer assignment of the same member); -DLANEDESCRIBE: the describe also
 * tells that the member's assignment of p is still the lane's (not what the
 * Go code does: a way to P1 for the lane's own assignment, see MEMBERP1).
 */
#ifdef KIP
#ifdef LANEDESCRIBE
#define RCONFIRM(w, l, v, a) ok = (holder == w && life == l && holderAsg == a); G = gen; by = holderAsg
#else
#define RCONFIRM(w, l, v, a) ok = (holder == w && life == l); G = gen; by = holderAsg
#endif
#else
#ifdef MEMBERVOUCH
#define RCONFIRM(w, l, v, a) ok = (life == l && gen == v); G = gen; by = holderAsg
#else
#define RCONFIRM(w, l, v, a) ok = (holder == w && life == l && gen == v && holderAsg == a); G = gen; by = holderAsg
#endif
#endif

/* -DOWNERONLY: the claimant is its worker (a member id kept across
   assignments), not the lane */
#ifdef OWNERONLY
#define CLAIMANT(x) asgWorker[x]
#else
#define CLAIMANT(x) (x)
#endif

/* The lane order: a claim by lane a is refused, whatever the tokens, when
   the row is held by a newer lane (higher claim id) of the same member. */
#if defined(NOLANEORDER) || defined(OWNERONLY)
#define SUPERSEDED(a) false
#else
#ifdef IDSDOWN
/* -DIDSDOWN: the lane order kept, but claim ids that do not grow with the
   lanes (here they shrink: the worst case of ids drawn at random) */
#define SUPERSEDED(a) (row && rOwnW == w && rOwnL == l && a > rClaim)
#else
#define SUPERSEDED(a) (row && rOwnW == w && rOwnL == l && a < rClaim)
#endif
#endif

/*
 * What P1 checks a recovering lane's claims and commits against (RPA):
 * classic, its own assignment a. Under KIP-848 the describe vouches for the
 * member, not for the lane: a recovering lane can take p for its member's
 * newer assignment before that assignment's own lane has claimed it (after
 * an older assignment's claim, of another member), which fails P1 for its
 * own assignment (-DSTRICTP1 shows it). What holds there (MEMBERP1): P1 for
 * the assignment the describe showed (RPA by: its member's current one),
 * and the lane order: once a lane's claim has been accepted, nothing of an
 * older lane of the same worker is accepted (LANECHECK).
 */
#if defined(KIP) && !defined(STRICTP1) && MAXRECOV > 0
#define MEMBERP1
#endif
#ifdef MEMBERP1
byte laneNewest[NW];    /* ghost: per worker, its newest lane with an accepted claim */
#define RPA by
#define LANECHECK(w, a) assert(a >= laneNewest[w])
#define LANENOTE(w, a) if :: a > laneNewest[w] -> laneNewest[w] = a :: else -> skip fi
#else
#define RPA a
#define LANECHECK(w, a) skip
#define LANENOTE(w, a) skip
#endif

inline accept(by, ti, te) {
	assert(by >= newest);                 /* P1 */
	assert(!LESS(ti, te, maxInc, maxEp)); /* P2 */
	if
	:: LESS(maxInc, maxEp, ti, te) -> maxInc = ti; maxEp = te
	:: else -> skip
	fi
}

/*
 * One claim by lane a of worker w (lifetime l) at epoch v: at most maxr
 * rounds of register, confirm, bump, claim. rec: a recovering lane (its own
 * confirmation, RCONFIRM). pa: the assignment P1 checks the claim for (a
 * worker's claim: the one its confirmation vouched for; a recovering lane's:
 * RPA). It ends with won (the claim accepted: J, v and from are the
 * lane's), with sup (refused by the lane order: the lane is superseded), or
 * with neither (not confirmed, or out of rounds).
 */
inline claim_rounds(rec, maxr, pa) {
	do
	:: rounds == maxr -> break
	:: else ->
		rounds++;
#ifdef OLD
		J = inc;                  /* read the incarnation */
		if
		:: rec -> printf("worker %d (assignment %d, recovering): reads incarnation %d\n", w, a, J)
		:: else -> printf("worker %d (assignment %d): reads incarnation %d\n", w, a, J)
		fi;
#else
#ifndef LATEREG
		/* register: read the incarnation and its high epoch, raise it to v */
		atomic { J = inc; h = hw; if :: hw < v -> hw = v :: else -> skip fi;
			if
			:: rec -> printf("worker %d (assignment %d, recovering): registers epoch %d under incarnation %d (high epoch was %d)\n", w, a, v, J, h)
			:: else -> printf("worker %d (assignment %d): registers epoch %d under incarnation %d (high epoch was %d)\n", w, a, v, J, h)
			fi }
#endif
#endif
		atomic {
			if
			:: rec -> RCONFIRM(w, l, v, a)
			:: else -> CONFIRM(w, l, v)
			fi;
			if
			:: rec -> printf("worker %d (assignment %d, recovering): coordinator confirms epoch %d: %d\n", w, a, v, ok)
			:: else -> printf("worker %d (assignment %d): coordinator confirms epoch %d: %d\n", w, a, v, ok)
			fi
		};
#ifdef LATEREG
		atomic { J = inc; h = hw; if :: hw < v -> hw = v :: else -> skip fi }
#endif
		if
		:: !ok -> break           /* not the owner (any more): claim nothing */
#ifndef OLD
		:: ok && G != v ->
			/* KIP-848: the token is the group epoch at a confirmation that
			   followed its registration; the epoch moved (or ours is from
			   another lifetime): take the current one and register again */
			v = G
		:: ok && G == v && (h > v || tie) ->
			/* an epoch above ours was registered under J although the
			   coordinator confirmed ours after we read J: the epochs
			   restarted (or, tie: a claim at our very token by another
			   claimant). Move the incarnation on, then start over. */
			atomic { if :: inc == J -> inc = J + 1; hw = 0; printf("worker %d: bumps the incarnation to %d\n", w, inc) :: else -> skip fi };
			tie = false
		:: ok && G == v && !(h > v || tie) ->
#else
		:: ok ->
#endif
			/* the claim statement */
			atomic {
				if
#ifdef OLD
				:: !SUPERSEDED(a) && (!row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && rClaim == a)) ->
#else
#ifdef NOCURINC
				:: !SUPERSEDED(a) && (!row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a))) ->
#else
				:: inc == J && !SUPERSEDED(a) && (!row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a))) ->
#endif
#endif
					if
					:: rec -> printf("postgres: claim %d.%d by worker %d (assignment %d, recovering) accepted\n", J, v, w, a)
					:: else -> printf("postgres: claim %d.%d by worker %d (assignment %d) accepted\n", J, v, w, a)
					fi;
					accept(pa, J, v);
					LANECHECK(w, a); LANENOTE(w, a);
					if :: pa > newest -> newest = pa :: else -> skip fi;
					row = true; rInc = J; rEp = v; rClaim = a; rOwnW = w; rOwnL = l; from = next; won = true
				:: else ->
					sup = SUPERSEDED(a);
					tie = (!sup && row && rInc == J && rEp == v && CLAIMANT(rClaim) != CLAIMANT(a));
					if
					:: rec -> printf("postgres: claim %d.%d by worker %d (assignment %d, recovering) rejected\n", J, v, w, a)
					:: else -> printf("postgres: claim %d.%d by worker %d (assignment %d) rejected\n", J, v, w, a)
					fi;
					if :: sup -> printf("postgres: (a newer lane of the same member holds the row: superseded)\n") :: else -> skip fi
				fi
			}
			if
			:: won || sup -> break
			:: else -> skip
			fi
#ifdef OLD
			;
			/* rejected by the same incarnation at an epoch at or above ours
			   while the coordinator confirmed ours: bump */
			atomic { if :: rInc == J && inc == J -> inc = J + 1 :: else -> skip fi }
#endif
		fi
	od
}

/* The commits of lane a (worker asgWorker[a], lifetime l) with token J.v;
   n: the recovery attempts it has left, for when one is rejected. */
proctype Committer(byte a; byte J; byte v; byte by; byte from; byte l; byte n) {
	byte k = 0;
	do
	:: k < MAXCOMMITS ->
		atomic {
			/* the commit's WHERE clause: token, claimant and offset */
			if
			:: row && rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a) && next == from ->
				printf("postgres: commit %d.%d (assignment %d) accepted\n", J, v, a);
				accept(by, J, v);
				LANECHECK(asgWorker[a], a);
				assert(next == from);   /* P3 */
				next++; from++; k++
			:: else ->
				printf("postgres: commit %d.%d (assignment %d) rejected\n", J, v, a);
				/* the lane recovers, beside whatever its worker does next */
#if MAXRECOV > 0
				if :: n > 0 -> run Recovery(asgWorker[a], a, l, n) :: else -> skip fi;
#endif
				k = MAXCOMMITS
			fi
		}
	:: else -> break
	od
}

/*
 * A recovering lane a of worker w (lifetime l), n attempts left. Each asks
 * the coordinator first (a lane never registers while it waits), then
 * claims at the epoch it was told, with its own claimant, and commits.
 */
proctype Recovery(byte w; byte a; byte l; byte n) {
	byte v, J, h, G, by, rounds, from;
	bool ok, tie, won, sup;
	do
	:: n > 0 ->
		atomic {
			n--; v = gen; RCONFIRM(w, l, v, a); rounds = 0; tie = false;
			printf("worker %d (assignment %d, recovering): asks the coordinator: epoch %d: %d\n", w, a, v, ok)
		};
		if
		:: ok -> claim_rounds(1, MAXROUNDS, RPA)
		:: else -> skip
		fi;
		atomic {
			if
			:: won -> run Committer(a, J, v, RPA, from, l, n); n = 0
			:: sup -> n = 0        /* superseded: give up */
			:: else -> skip        /* try again */
			fi;
			v = 0; J = 0; h = 0; G = 0; by = 0; rounds = 0; from = 0; ok = false; tie = false; won = false; sup = false
		}
	:: else -> break
	od
}

proctype Worker(byte w) {
	byte handled = 0;
	byte a, l, v, J, h, G, by, rounds, from;
	bool ok, tie, won, sup;
end_idle:
	do
	:: asgSeq[w] > handled ->
		atomic { a = asgSeq[w]; l = asgLife[w]; v = asgEp[w]; handled = a; rounds = 0; tie = false; won = false; sup = false }
		claim_rounds(0, MAXROUNDS, by);
		atomic {
			if
			:: won -> run Committer(a, J, v, by, from, l, MAXRECOV)
#if MAXRECOV > 0
			:: !won && !sup -> run Recovery(w, a, l, MAXRECOV)
#endif
			:: else -> skip
			fi;
			/* forget this assignment's locals, so that states merge */
			a = 0; l = 0; v = 0; J = 0; h = 0; G = 0; by = 0; rounds = 0; from = 0; ok = false; tie = false; won = false; sup = false
		}
	od
}

active proctype Coordinator() {
	byte w;
	do
	:: nasg < MAXASG && gen < MAXGEN ->
		/* a rebalance that assigns p to w at a new epoch */
		atomic {
			gen++;
			w = 0; do :: w < NW - 1 -> w++ :: break od;
			nasg++; holder = w; holderAsg = nasg;
			asgSeq[w] = nasg; asgLife[w] = life; asgEp[w] = gen; asgWorker[nasg] = w;
			printf("coordinator: assignment %d: p to worker %d (lifetime %d, epoch %d)\n", nasg, w, life, gen)
		}
#ifdef KIP
	:: nasg < MAXASG && gen > 0 ->
		/* KIP-848: p moves to w within the same group epoch */
		atomic {
			w = 0; do :: w < NW - 1 -> w++ :: break od;
			nasg++; holder = w; holderAsg = nasg;
			asgSeq[w] = nasg; asgLife[w] = life; asgEp[w] = gen; asgWorker[nasg] = w;
			printf("coordinator: assignment %d: p moves to worker %d (lifetime %d, same epoch %d)\n", nasg, w, life, gen)
		}
#endif
	:: gen < MAXGEN ->
		/* a rebalance that leaves p where it is */
		atomic { gen++; printf("coordinator: rebalance, epoch %d, p stays\n", gen) }
	:: life < MAXLIFE ->
		/* the group is deleted, or expires while empty: its epochs restart */
		atomic { life++; gen = 0; holder = NONE; printf("coordinator: group deleted (or expired): lifetime %d begins, epochs restart\n", life) }
	:: break
	od
}

init {
	atomic {
		byte i = 0;
		do
		:: i < NW -> run Worker(i); i++
		:: else -> break
		od
	}
}
