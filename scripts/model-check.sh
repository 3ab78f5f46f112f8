#!/usr/bin/env bash
# Model-checks the ownership protocol (docs/model/ownership.pml) with spin:
# the protocol tenure runs must pass on both group protocols, and the
# protocol before group lifetimes were registered (-DOLD), as well as the
# protocol with one of its steps taken out, must each fail, so that the
# model is known to be able to catch the hole it is about. The shortest
# counterexample of -DOLD is printed (docs/fencing.md shows it).
#
# Needs spin (Debian package spin) and a C compiler. Exits non-zero if any
# run does not end as expected. `scripts/test.sh` runs it; `make model` too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=$PWD/docs/model/ownership.pml

for tool in spin gcc; do
	command -v "$tool" >/dev/null || { echo "model-check: $tool is not installed (apt-get install spin gcc)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0
# run NAME EXPECT DEFINES...: EXPECT is pass (no assertion fails and the
# search is complete) or fail (an assertion fails).
run() {
	local name=$1 expect=$2
	shift 2
	local dir=$work/$name
	mkdir -p "$dir"
	cp "$model" "$dir/"
	(
		cd "$dir"
		spin -a "$@" ownership.pml >/dev/null
		# COLLAPSE: compressed state vectors (exhaustive, less memory);
		# MEMLIM in MB bounds what a run may take.
		gcc -w -O2 -DSAFETY -DCOLLAPSE -DMEMLIM=8000 -o pan pan.c
		start=$SECONDS
		./pan -m100000 >pan.out 2>&1 || true
		echo $((SECONDS - start)) >secs
	)
	local out=$dir/pan.out states errors complete=yes got
	states=$(awk '/states, stored/ { print $1; exit }' "$out")
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | head -n 1)
	grep -q "Search not completed" "$out" && complete=no
	if [[ ${errors:-x} == 0 && $complete == yes ]]; then
		got=pass
	elif [[ ${errors:-0} -gt 0 ]] && grep -q "assertion violated" "$out"; then
		got=fail
	else
		got="inconclusive (errors ${errors:-?}, search complete: $complete)"
	fi
	local verdict=ok
	if [[ $got != "$expect" ]]; then
		verdict=UNEXPECTED
		failed=1
	fi
	printf '  %-28s expected %-4s got %-4s %10s states %4ss  %-10s %s\n' "$name" "$expect" "$got" "$states" "$(cat "$dir/secs")" "$verdict" "$*"
	if [[ $verdict != ok ]]; then
		sed 's/^/    | /' "$out" | tail -n 30
	fi
}

echo "model check: docs/model/ownership.pml ($(spin -V | head -n 1))"
# The protocol tenure runs: 3 workers, 2 group lifetimes.
run classic pass -DNW=3 -DMAXGEN=3 -DMAXASG=4
run kip848 pass -DKIP -DNW=3 -DMAXGEN=2 -DMAXASG=3
# The protocol before issue 7 (no registration): must produce the hole.
run old-classic fail -DOLD -DNW=3 -DMAXGEN=2
run old-kip848 fail -DOLD -DKIP -DNW=3 -DMAXGEN=2 -DMAXASG=3
# Each load-bearing step taken out must fail too.
run register-after-confirm fail -DLATEREG -DNW=3 -DMAXGEN=2
run claimant-is-member-not-lane fail -DOWNERONLY -DNW=3 -DMAXGEN=2

# The counterexample of the old protocol, shortest found (-i).
(
	cd "$work/old-classic"
	./pan -i -m300 >/dev/null 2>&1 || true
	echo "  counterexample of the old protocol (spin -t -DOLD):"
	spin -t -DOLD ownership.pml 2>&1 | grep -E "coordinator:|worker|postgres:|assertion" | sed 's/^ */    /'
)

if [[ $failed != 0 ]]; then
	echo "model check FAILED: a run did not end as expected" >&2
	exit 1
fi
echo "model check passed"
