#!/usr/bin/env bash
# Model-checks the strict hand-off (docs/model/strict.pml) with spin: the
# strict protocol must keep G3-strict, G3-record and END on the classic
# protocol and on KIP-848 with Kafka's offset commit rules (<= 4.2, and 4.3's
# KIP-1251), with answers lost (the *-losses runs: an offset commit sent
# again by the client library or by the lane, earlier copies processed late
# and out of order; a PREPARE's answer lost); it must fail G3-strict on
# KIP-848 with kfake's rule, where only a lane check after the acceptance
# plus presumed abort (no decision record in Kafka) restores it; and each
# load-bearing step taken out must fail, with the property it protects,
# among them the rule before the decision by the record
# (*-rollback-unless-lost: a rejection rolled back unless an answer was
# known lost). The shortest counterexample of every failing run is printed
# (found by a breadth-first search).
#
# Bounds (see the runs): 2 workers (3 in the *-3workers runs); up to 3
# generations / group epochs in one lifetime, or 2 and then 1 in a second
# lifetime (the *-lifetimes runs); 2-3 batches in all, 1-2 per lane; 0-2
# worker crashes; 0-2 lost answers; 1 retry per batch at a newer
# generation. Searches are exhaustive within them (COLLAPSE compresses
# states, nothing is hashed away). About 4.5 minutes of CPU on a 2-core
# machine (the runs are sequential), 2 GB of memory at most.
#
# Needs spin (Debian package spin) and a C compiler. Exits non-zero if any
# run does not end as expected.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=$PWD/docs/model/strict.pml
# shellcheck source=scripts/model-lib.sh
source scripts/model-lib.sh
model_setup model-check-strict

failing=()
# run NAME EXPECT DEFINES...: EXPECT is pass (no assertion fails, no invalid
# end state, the search is complete: a depth-first search of compressed
# states), or fail:S, fail:R, fail:END (a breadth-first search, so that the
# counterexample is a shortest one, finds a violation of G3-strict's,
# G3-record's or END's assertion).
run() {
	local name=$1 expect=$2
	shift 2
	local dir states errors complete got what start end
	run_dir "$name" "$model" "$@"
	(
		cd "$dir"
		spin -a "$@" strict.pml >/dev/null
		if [[ $expect == pass ]]; then
			gcc -w -O2 -DSAFETY -DCOLLAPSE -DMEMLIM=8000 -o pan pan.c
		else
			gcc -w -O1 -DSAFETY -DBFS -DMEMLIM=8000 -o pan pan.c
		fi
	)
	start=$EPOCHREALTIME
	(cd "$dir" && ./pan -m100000 >pan.out 2>&1) || true
	end=$EPOCHREALTIME
	local out=$dir/pan.out
	pan_read "$out"
	what=$(grep -m 1 "assertion violated" "$out" || true)
	if [[ ${errors:-x} == 0 && $complete == yes ]]; then
		got=pass
	elif [[ $what == *okAcc* ]]; then
		got=fail:S
	elif [[ $what == *bst\[* || $what == *acc\[* ]]; then
		got=fail:R
	elif [[ $what == *lockB* ]]; then
		got=fail:END
	else
		got="inconclusive(errors=${errors:-?},complete=$complete)"
	fi
	local verdict
	judge "$got" "$expect"
	[[ $got == fail:* ]] && failing+=("$name")
	printf '  %-32s %-8s %-8s %10s %6.1fs  %-10s %s\n' "$name" "$expect" "$got" "$states" \
		"$(awk -v s="$start" -v e="$end" 'BEGIN { print e - s }')" "$verdict" "$*"
	show_unexpected "$out"
}

# counterexample NAME: the trail of the failed run NAME, replayed.
counterexample() {
	local name=$1
	(
		cd "$work/$name"
		mapfile -t defines <defines
		echo "  $name (spin -t ${defines[*]}):"
		spin -t "${defines[@]}" strict.pml 2>&1 | grep -E "coordinator:|worker|postgres:|assertion" | sed 's/^ */    /'
	)
}

echo "model check: docs/model/strict.pml ($(spin -V | head -n 1))"
printf '  %-32s %-8s %-8s %10s %7s  %-10s %s\n' run expected got states time verdict defines

# The bounds of the passing runs: without lost answers (a crash loses the
# answer) ...
gens="-DMAXLOSS=0 -DMAXB=3 -DMAXBL=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=1"   # 3 generations, 2 batches per lane
crashes="-DMAXLOSS=0 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=2"         # 2 crashes
lifetimes="-DMAXLOSS=0 -DMAXB=3 -DMAXGEN=2 -DMAXGEN2=1 -DMAXLIFE=2 -DMAXCRASH=1"
three="-DMAXLOSS=0 -DNW=3 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=1"
# ... and with answers lost (an offset commit's connection broken and the
# request sent again by the client, or no answer in time and the request
# sent again by the lane, both leaving a copy that may be processed late;
# a PREPARE's answer lost): one lost answer, or two; with a crash.
losses="-DMAXLOSS=1 -DMAXB=3 -DMAXBL=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=0"
losses2="-DMAXLOSS=2 -DMAXB=3 -DMAXBL=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=0"
lcrash="-DMAXLOSS=1 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=1"
lgens="-DMAXLOSS=1 -DMAXB=3 -DMAXBL=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=1"
llifetimes="-DMAXLOSS=1 -DMAXB=2 -DMAXGEN=2 -DMAXGEN2=1 -DMAXLIFE=2 -DMAXCRASH=0"
lthree="-DMAXLOSS=1 -DNW=3 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=0"
# The bounds of the failing runs (small: each must fail within them).
small="-DMAXLOSS=0 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1"
smalll="-DMAXLOSS=0 -DMAXB=2 -DMAXGEN=2 -DMAXGEN2=1 -DMAXLIFE=2"
chain="-DMAXLOSS=0 -DMAXB=3 -DMAXGEN=3 -DMAXLIFE=1 -DMAXCRASH=2"
lsmall="-DMAXLOSS=1 -DMAXB=2 -DMAXGEN=3 -DMAXLIFE=1"

# shellcheck disable=SC2086 # the bounds are lists of defines
{
	# The strict protocol, decided by the record naming the batch (-DEXACT).
	for proto in classic kip848-4.2 kip848-4.3; do
		case $proto in
		classic) p="" ; x="" ;;
		kip848-4.2) p="-DKIP" ; x="-DEXPIRE" ;;
		kip848-4.3) p="-DKIP -DKIP1251" ; x="-DEXPIRE" ;;
		esac
		run $proto pass -DEXACT $p $gens
		run $proto-crashes pass -DEXACT $p $crashes
		run $proto-lifetimes pass -DEXACT -DFOREIGN $p $x $lifetimes
		run $proto-3workers pass -DEXACT $p $three
		run $proto-losses pass -DEXACT $p $losses
		run $proto-losses-2 pass -DEXACT $p $losses2
		run $proto-losses-crash pass -DEXACT $p $lcrash
		run $proto-losses-lifetimes pass -DEXACT -DFOREIGN $p $x $llifetimes
		run $proto-losses-3workers pass -DEXACT $p $lthree
	done
	run classic-losses-gens pass -DEXACT $lgens
	# The issue's rule (committed offset at or past the batch's end) holds
	# as long as nobody else commits the group's offsets.
	run classic-geq pass $gens
	run classic-geq-lifetimes pass $lifetimes
	run kip848-4.2-geq pass -DKIP $gens
	run kip848-4.2-geq-lifetimes pass -DKIP -DEXPIRE $lifetimes
	run classic-geq-losses pass $losses
	run classic-geq-losses-crash pass $lcrash
	run classic-geq-foreign fail:S -DNOR -DFOREIGN $smalll

	# kfake's KIP-848 rule accepts an ended assignment's commit.
	run kip848-kfake fail:S -DKIP -DKFAKE -DNOR $small
	# A lane check after the acceptance does not save the resolvers ...
	run kip848-kfake-postcheck fail:S -DKIP -DKFAKE -DPOSTCHECK -DNOR $small
	# ... presumed abort does, but Kafka's offsets are no decision record.
	run kip848-kfake-postcheck-presume pass -DKIP -DKFAKE -DPOSTCHECK -DPRESUME -DNOR $gens
	run kip848-kfake-post-presume-life pass -DKIP -DKFAKE -DPOSTCHECK -DPRESUME -DNOR $lifetimes
	run kip848-kfake-presume-record fail:R -DKIP -DKFAKE -DPOSTCHECK -DPRESUME $small

	# Each load-bearing step taken out.
	run classic-current-generation fail:S -DNOR -DEXACT -DCURGEN $small
	run kip848-4.2-current-epoch fail:S -DNOR -DEXACT -DKIP -DCURGEN $small
	run kip848-4.3-current-epoch fail:S -DNOR -DEXACT -DKIP -DKIP1251 -DCURGEN $small
	run classic-current-member-id fail:S -DNOR -DEXACT -DCURMEMBER $smalll
	run kip848-4.2-ids-kept fail:S -DNOR -DEXACT -DKIP -DSAMEIDS $smalll
	run classic-retry-member-vouch fail:S -DNOR -DEXACT -DMEMBERVOUCH $small
	run kip848-4.2-retry-member-vouch fail:S -DNOR -DEXACT -DKIP -DMEMBERVOUCH $small
	run kip848-4.3-retry-member-vouch fail:S -DNOR -DEXACT -DKIP -DKIP1251 -DMEMBERVOUCH $small
	run classic-read-before-assignment fail:R -DEXACT -DEARLYREAD $small
	run kip848-4.2-read-before-assign fail:R -DEXACT -DKIP -DEARLYREAD $small
	run classic-read-before-assign-geq fail:S -DNOR -DEARLYREAD $chain
	run classic-resolve-newer fail:R -DEXACT -DNOOLDER $small
	run kip848-4.2-resolve-newer fail:R -DEXACT -DKIP -DNOOLDER $small
	run classic-resolve-newer-geq fail:S -DNOR -DNOOLDER $smalll
	# The rule before: a rejection rolls back unless an earlier answer of
	# the batch was lost, which the client's own resend hides.
	run classic-rollback-unless-lost fail:R -DEXACT -DLOSTONLY $lsmall
	run kip848-4.2-rollback-unless-lost fail:R -DEXACT -DKIP -DLOSTONLY $lsmall
	run kip848-4.3-rollback-unless-lost fail:R -DEXACT -DKIP -DKIP1251 -DLOSTONLY $lsmall
	run classic-rollback-unless-lost-geq fail:S -DNOR -DLOSTONLY $lsmall
	run classic-prepare-lost-guessed fail:R -DEXACT -DPREPGUESS $lsmall
	run classic-rollback-on-timeout fail:R -DEXACT -DTIMEOUTROLLBACK $small
	run classic-rollback-on-timeout-geq fail:S -DNOR -DTIMEOUTROLLBACK $chain
	run classic-mirror-on fail:R -DEXACT -DMIRROR $small
	run classic-no-resolution fail:END -DEXACT -DNORESOLVE $small
}

echo
echo "shortest counterexamples:"
for name in "${failing[@]}"; do
	counterexample "$name"
done

if [[ $failed != 0 ]]; then
	echo "model check FAILED: a run did not end as expected" >&2
	exit 1
fi
echo "model check passed"
