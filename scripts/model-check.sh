#!/usr/bin/env bash
# Model-checks the ownership protocol (docs/model/ownership.pml) with spin:
# the protocol tenure runs must pass on both group protocols, and the
# protocol before group lifetimes were registered (-DOLD), as well as the
# protocol with one of its steps taken out, must each fail, so that the
# model is known to be able to catch the hole it is about. The same for lane
# recovery: the fixed recovery must pass, recovery vouched for by the member
# (-DMEMBERCONFIRM) and each piece of the fix taken out must fail where it
# is load-bearing. The shortest counterexamples are printed (docs/fencing.md
# shows them): of -DOLD, of -DMEMBERCONFIRM (classic), of KIP-848 recovery
# without the lane order, and the one that keeps KIP-848 recovery from P1
# for the lane's own assignment. And joint commits (docs/model/joint.pml:
# one transaction over two partitions, one of them moved to another worker
# at any step) must pass, and fail with the fence statement checking row by
# row (-DPERROW), whose shortest counterexample is printed too, with a
# failed handler's lane kept in the fence statement (-DMOVEFAILED), and
# without row locks (-DNOLOCK).
#
# Needs spin (Debian package spin) and a C compiler. Exits non-zero if any
# run does not end as expected. `scripts/test.sh` runs it; `make model` too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/model-lib.sh
source scripts/model-lib.sh
model_setup model-check

# run NAME EXPECT DEFINES...: checks $model (the model being run); EXPECT
# is pass (no assertion fails and the search is complete) or fail (an
# assertion fails).
run() {
	local name=$1 expect=$2
	shift 2
	local dir states errors complete got
	run_dir "$name" "$model" "$@"
	(
		cd "$dir"
		spin -a "$@" "$(basename "$model")" >/dev/null
		# COLLAPSE: compressed state vectors (exhaustive, less memory);
		# MEMLIM in MB bounds what a run may take.
		gcc -w -O2 -DSAFETY -DCOLLAPSE -DMEMLIM=8000 -o pan pan.c
		start=$SECONDS
		./pan -m100000 >pan.out 2>&1 || true
		echo $((SECONDS - start)) >secs
	)
	local out=$dir/pan.out
	pan_read "$out"
	if [[ ${errors:-x} == 0 && $complete == yes ]]; then
		got=pass
	elif [[ ${errors:-0} -gt 0 ]] && grep -q "assertion violated" "$out"; then
		got=fail
	else
		got="inconclusive (errors ${errors:-?}, search complete: $complete)"
	fi
	local verdict
	judge "$got" "$expect"
	printf '  %-34s expected %-4s got %-4s %10s states %4ss  %-10s %s\n' "$name" "$expect" "$got" "$states" "$(cat "$dir/secs")" "$verdict" "$*"
	show_unexpected "$out"
}

# counterexample NAME TITLE [bfs]: the shortest counterexample of the failed
# run NAME, replayed with its defines: found by pan -i (iterative shortening,
# which keeps the old protocol's trail the one docs/fencing.md shows), or
# with bfs by a breadth-first search (the shortest there is).
counterexample() {
	local name=$1 title=$2 how=${3:-}
	(
		cd "$work/$name"
		mapfile -t defines <defines
		if [[ $how == bfs ]]; then
			gcc -w -O2 -DSAFETY -DBFS -DMEMLIM=8000 -o pan-bfs pan.c
			./pan-bfs >/dev/null 2>&1 || true
		else
			./pan -i -m300 >/dev/null 2>&1 || true
		fi
		pml=$(basename "$(ls ./*.pml)")
		echo "  counterexample of $title (spin -t ${defines[*]} $pml):"
		spin -t "${defines[@]}" "$pml" 2>&1 | grep -E "coordinator:|worker|postgres:|assertion" | sed 's/^ */    /'
	)
}

model=$PWD/docs/model/ownership.pml
echo "model check: docs/model/ownership.pml ($(spin -V | head -n 1))"
# The claim protocol tenure runs, without lane recovery: 3 workers, 2 group
# lifetimes.
run classic pass -DMAXRECOV=0 -DNW=3 -DMAXGEN=3 -DMAXASG=4
run kip848 pass -DMAXRECOV=0 -DKIP -DNW=3 -DMAXGEN=2 -DMAXASG=3
# The protocol before issue 7 (no registration): must produce the hole.
run old-classic fail -DMAXRECOV=0 -DOLD -DNW=3 -DMAXGEN=2
run old-kip848 fail -DMAXRECOV=0 -DOLD -DKIP -DNW=3 -DMAXGEN=2 -DMAXASG=3
# Each load-bearing step taken out must fail too.
run register-after-confirm fail -DMAXRECOV=0 -DLATEREG -DNW=3 -DMAXGEN=2
run claimant-is-member-not-lane fail -DMAXRECOV=0 -DOWNERONLY -DNW=3 -DMAXGEN=2

# With lane recovery: 2 workers, 2 group lifetimes, 3 assignments, 2
# recovery attempts per lane; 3 epochs per lifetime (classic), 2 (KIP-848).
rc="-DNW=2 -DMAXGEN=3 -DMAXASG=3 -DMAXRECOV=2"
rk="-DKIP -DNW=2 -DMAXGEN=2 -DMAXASG=3 -DMAXRECOV=2"
# shellcheck disable=SC2086 # $rc and $rk are lists of defines
{
	run classic-recovery pass $rc
	run kip848-recovery pass $rk
	# KIP-848: the describe vouches for the member, so a recovering lane
	# can claim for its member's newer assignment; P1 for the lane's own
	# assignment does not hold (what does: MEMBERP1 in the model).
	run kip848-recovery-own-assignment fail $rk -DSTRICTP1
	# Recovery as it was: vouched for by the member, no lane order.
	run recovery-member-confirm-classic fail $rc -DMEMBERCONFIRM
	run recovery-member-confirm-kip848 fail $rk -DMEMBERCONFIRM
	# Each piece of the fix taken out alone, where it is load-bearing.
	run recovery-heartbeat-only-classic fail $rc -DMEMBERVOUCH
	run no-lane-order-kip848 fail $rk -DNOLANEORDER
	run claim-ids-not-growing-kip848 fail $rk -DIDSDOWN
	# Classic recovery confirms the lane's own assignment: the lane order
	# is not needed for the property there.
	run no-lane-order-classic pass $rc -DNOLANEORDER
}

# Joint commits: one transaction over two partitions, 2 workers, either
# partition moved to the other worker at any step (2 moves in all), 2 jobs
# per partition, 1 lost COMMIT answer, 1 session ended from outside, 1
# handler failure, 4 transactions per worker. The fence statement checking
# row by row (the refused partition's output committed with the others'), a
# lane whose handler failed kept in it, and no row locks must each fail.
model=$PWD/docs/model/joint.pml
echo "model check: docs/model/joint.pml"
run joint pass
run joint-fence-row-by-row fail -DPERROW
run joint-failed-lane-in-fence fail -DMOVEFAILED
run joint-no-row-locks fail -DNOLOCK

# The counterexamples.
counterexample old-classic "the old protocol"
counterexample recovery-member-confirm-classic "recovery vouched for by the member" bfs
counterexample no-lane-order-kip848 "KIP-848 recovery without the lane order" bfs
counterexample kip848-recovery-own-assignment "KIP-848 recovery, P1 for the lane's own assignment" bfs
counterexample joint-fence-row-by-row "a joint commit whose fence statement checks row by row" bfs

if [[ $failed != 0 ]]; then
	echo "model check FAILED: a run did not end as expected" >&2
	exit 1
fi
echo "model check passed"
