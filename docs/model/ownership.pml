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
 *   -DOLD          the protocol before registration (incarnation read once,
 *                  bumped only when a claim is rejected): must FAIL
 *
 * The property (assertions, checked at every accepted claim and commit):
 *   P1 (lifetimes and hand-offs) once the claim of a newer assignment of p
 *      (coordinator order; a newer group lifetime's assignments are newer)
 *      has been accepted, no claim or commit made for an older assignment
 *      is accepted, whatever the epoch values;
 *   P2 (G2) accepted tokens never go down;
 *   P3 (G1) commits advance the next offset from where it stood, once each.
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

/* ---- Postgres ---- */
byte inc = 0;           /* the group's incarnation */
byte hw = 0;            /* highest epoch registered under inc */
bool row = false;       /* p's fencing row exists */
byte rInc = 0;
byte rEp = 0;
byte rClaim = 0;        /* the claimant (its assignment number: unique per lane) */
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

/* -DOWNERONLY: the claimant is its worker (a member id kept across
   assignments), not the lane */
byte asgWorker[MAXASG + 1];
#ifdef OWNERONLY
#define CLAIMANT(x) asgWorker[x]
#else
#define CLAIMANT(x) (x)
#endif

inline accept(by, ti, te) {
	assert(by >= newest);                 /* P1 */
	assert(!LESS(ti, te, maxInc, maxEp)); /* P2 */
	if
	:: LESS(maxInc, maxEp, ti, te) -> maxInc = ti; maxEp = te
	:: else -> skip
	fi
}

proctype Committer(byte a; byte J; byte v; byte by; byte from) {
	byte n = 0;
	do
	:: n < MAXCOMMITS ->
		atomic {
			/* the commit's WHERE clause: token, claimant and offset */
			if
			:: row && rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a) && next == from ->
				printf("postgres: commit %d.%d (assignment %d) accepted\n", J, v, a);
				accept(by, J, v);
				assert(next == from);   /* P3 */
				next++; from++
			:: else -> skip
			fi
		}
		n++
	:: else -> break
	od
}

proctype Worker(byte w) {
	byte handled = 0;
	byte a, l, v, J, h, G, by, rounds, from;
	bool ok, tie, won;
end_idle:
	do
	:: asgSeq[w] > handled ->
		atomic { a = asgSeq[w]; l = asgLife[w]; v = asgEp[w]; handled = a; rounds = 0; tie = false; won = false }
round:
		if
		:: rounds == MAXROUNDS -> goto over
		:: else -> rounds++
		fi;
#ifdef OLD
		J = inc;                  /* read the incarnation */
		printf("worker %d (assignment %d): reads incarnation %d\n", w, a, J);
#else
#ifndef LATEREG
		/* register: read the incarnation and its high epoch, raise it to v */
		atomic { J = inc; h = hw; if :: hw < v -> hw = v :: else -> skip fi;
			printf("worker %d (assignment %d): registers epoch %d under incarnation %d (high epoch was %d)\n", w, a, v, J, h) }
#endif
#endif
		atomic { CONFIRM(w, l, v); printf("worker %d (assignment %d): coordinator confirms epoch %d: %d\n", w, a, v, ok) };
#ifdef LATEREG
		atomic { J = inc; h = hw; if :: hw < v -> hw = v :: else -> skip fi }
#endif
		if
		:: !ok -> goto over       /* not the owner (any more): claim nothing */
		:: else -> skip
		fi;
#ifndef OLD
		if
		:: G != v ->
			/* KIP-848: the token is the group epoch at a confirmation that
			   followed its registration; the epoch moved (or ours is from
			   another lifetime): take the current one and register again */
			v = G; goto round
		:: G == v && (h > v || tie) ->
			/* an epoch above ours was registered under J although the
			   coordinator confirmed ours after we read J: the epochs
			   restarted (or, tie: a claim at our very token by another
			   claimant). Move the incarnation on, then start over. */
			atomic { if :: inc == J -> inc = J + 1; hw = 0; printf("worker %d: bumps the incarnation to %d\n", w, inc) :: else -> skip fi };
			tie = false;
			goto round
		:: else -> skip
		fi;
#endif
		/* the claim statement */
		atomic {
			if
#ifdef OLD
			:: !row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && rClaim == a) ->
#else
			#ifdef NOCURINC
			:: (!row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a))) ->
#else
			:: inc == J && (!row || LESS(rInc, rEp, J, v) || (rInc == J && rEp == v && CLAIMANT(rClaim) == CLAIMANT(a))) ->
#endif
#endif
				printf("postgres: claim %d.%d by worker %d (assignment %d) accepted\n", J, v, w, a);
				accept(by, J, v);
				if :: by > newest -> newest = by :: else -> skip fi;
				row = true; rInc = J; rEp = v; rClaim = a; from = next; won = true
			:: else ->
				tie = (row && rInc == J && rEp == v && CLAIMANT(rClaim) != CLAIMANT(a));
				printf("postgres: claim %d.%d by worker %d (assignment %d) rejected\n", J, v, w, a)
			fi
		}
		if
		:: won -> run Committer(a, J, v, by, from); goto over
		:: else -> skip
		fi;
#ifdef OLD
		/* rejected by the same incarnation at an epoch at or above ours
		   while the coordinator confirmed ours: bump */
		atomic { if :: rInc == J && inc == J -> inc = J + 1 :: else -> skip fi };
#endif
		goto round;
over:
		/* forget this assignment's locals, so that states merge */
		atomic { a = 0; l = 0; v = 0; J = 0; h = 0; G = 0; by = 0; rounds = 0; from = 0; ok = false; tie = false; won = false }
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
		gen++;          /* a rebalance that leaves p where it is */
		printf("coordinator: rebalance, epoch %d, p stays\n", gen)
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
